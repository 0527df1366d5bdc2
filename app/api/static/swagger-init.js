// Starts Swagger UI on /api/docs. A file, not an inline script, so the page's CSP stays script-src 'self'.
window.addEventListener("load", function () {
  var root = document.getElementById("swagger-ui");
  window.ui = SwaggerUIBundle({
    url: root.dataset.specUrl,
    dom_id: "#swagger-ui",
    deepLinking: true,
    presets: [SwaggerUIBundle.presets.apis],
    layout: "BaseLayout",
    validatorUrl: null,          // never ask a third-party validator about our spec
    persistAuthorization: false  // a pasted token lives in this tab's memory only
  });
});
