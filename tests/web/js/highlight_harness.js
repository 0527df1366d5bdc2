// Runs app/library/static/library.js in node against a minimal DOM: the page loads with ?q=<query>,
// fetch answers the search with the hits given on stdin, and the result cards' highlights are
// printed as JSON: [{text, marks: [marked text, ...]}] per hit.
'use strict';
const fs = require('fs');
const vm = require('vm');

class Node {
  constructor(tag) { this.tag = tag; this.children = []; this.dataset = {}; this.attrs = {}; this.ownText = ''; }
  append(...c) { this.children.push(...c.map(Node.of)); }
  prepend(...c) { this.children.unshift(...c.map(Node.of)); }
  static of(c) { return c instanceof Node ? c : new TextNode(String(c)); }
  replaceChildren(...c) { this.children = c; }
  setAttribute(k, v) { this.attrs[k] = v; }
  addEventListener() {}
  set textContent(v) { this.children = []; this.ownText = String(v); }
  get textContent() { return this.ownText + this.children.map((c) => c.textContent).join(''); }
}
class TextNode extends Node { constructor(t) { super('#text'); this.ownText = t; } }

const [script, hitsFile, query] = process.argv.slice(2);
const ids = {};
// the index page's search parts only: no upload zone (no event stream), no image page, no meta tags
const byId = (sel) => (sel.startsWith('#') && sel !== '#upload' && sel !== '#context-form'
  ? (ids[sel] = ids[sel] || new Node('div')) : null);
let ready;
const document = {
  createElement: (tag) => new Node(tag),
  createTextNode: (t) => new TextNode(t),
  querySelector: byId,
  querySelectorAll: () => [],
  addEventListener: (type, fn) => { if (type === 'DOMContentLoaded') ready = fn; },
  body: new Node('body'),
};
const href = `http://localhost/?q=${encodeURIComponent(query)}`;
const body = JSON.parse(fs.readFileSync(hitsFile, 'utf8'));
const ctx = {
  Node, document, URL, URLSearchParams, console, setInterval, clearInterval, setTimeout, CSS: { escape: (s) => s },
  location: { href, search: new URL(href).search },
  history: { replaceState() {} },
  fetch: async () => ({ status: 200, ok: true, json: async () => body }),
};
ctx.window = ctx;
vm.createContext(ctx);
vm.runInContext(fs.readFileSync(script, 'utf8'), ctx);
ready();
setTimeout(() => {
  const hl = (n) => (n.attrs.class === 'hl' ? n : n.children.map(hl).find(Boolean));
  const marks = (n) => (n.tag === 'mark' ? [n.textContent] : n.children.flatMap(marks));
  const out = ids['#results-grid'].children.map((card) => {
    const p = hl(card);
    return p ? { text: p.textContent, marks: marks(p) } : null;
  });
  process.stdout.write(JSON.stringify(out));
}, 50);
