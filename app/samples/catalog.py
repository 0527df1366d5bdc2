"""What the sample memes say and show. Pure data; rendering lives in :mod:`app.samples.render`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sample:
    """One sample meme: file stem, caption lines, drawn subject, background colour, script."""

    name: str
    top: str
    bottom: str
    subject: str
    background: tuple[int, int, int]
    script: str = "latin"

    @property
    def filename(self) -> str:
        return f"{self.name}.png"

    @property
    def text(self) -> str:
        return " ".join(t for t in (self.top, self.bottom) if t)


_BLUE, _NAVY, _TEAL, _GREEN = (52, 101, 164), (32, 45, 84), (22, 130, 128), (46, 125, 50)
_PURPLE, _RED, _ORANGE, _BROWN = (106, 61, 154), (178, 34, 52), (214, 110, 20), (121, 85, 61)
_GREY, _PINK, _OLIVE, _SKY = (84, 90, 98), (196, 68, 128), (110, 120, 30), (70, 150, 210)

SAMPLES: tuple[Sample, ...] = (
    Sample("build-passes", "WHEN THE BUILD PASSES", "ON THE FIRST TRY", "rocket", _BLUE),
    Sample("friday-deploy", "ONE DOES NOT SIMPLY", "DEPLOY ON FRIDAY", "server", _RED),
    Sample("cheezburger-cat", "I CAN HAS", "CHEEZBURGER", "cat", _ORANGE),
    Sample("very-dog", "SUCH WOW", "VERY DOG", "dog", _TEAL),
    Sample("works-on-my-machine", "IT WORKS", "ON MY MACHINE", "computer", _NAVY),
    Sample("coffee-first", "COFFEE FIRST", "THEN CODE", "coffee", _BROWN),
    Sample("not-a-bug", "IT IS NOT A BUG", "IT IS A FEATURE", "bug", _GREEN),
    Sample("one-more-meeting", "ME AFTER", "ONE MORE MEETING", "coffee", _GREY),
    Sample("grumpy-cat", "GRUMPY CAT SAYS", "NO", "cat", _PURPLE),
    Sample("good-boy-logs", "GOOD BOY", "FETCHES THE LOGS", "dog", _OLIVE),
    Sample("tests-green", "TESTS ARE GREEN", "SHIP IT", "chart", _GREEN),
    Sample("monday-standup", "MONDAY MORNING", "STANDUP AGAIN", "coffee", _SKY),
    Sample("keep-calm-retry", "KEEP CALM", "AND RETRY", "cloud", _NAVY),
    Sample("cat-keyboard", "THE CAT", "SAT ON THE KEYBOARD", "cat", _TEAL),
    Sample("dog-server-room", "DOG WALKS INTO", "THE SERVER ROOM", "dog", _GREY),
    Sample("pizza-friday", "PIZZA FRIDAY", "BEST DAY OF THE WEEK", "pizza", _RED),
    Sample("hello-world", "HELLO WORLD", "", "computer", _PURPLE),
    Sample("sunny-no-incidents", "SUNNY DAY", "NO INCIDENTS", "sun", _SKY),
    Sample("graph-goes-up", "GRAPH GOES UP", "EVERYONE CLAPS", "chart", _NAVY),
    Sample("cache-miss", "CACHE MISS", "AGAIN", "server", _ORANGE),
    Sample("to-the-moon", "LAUNCH DAY", "TO THE MOON", "rocket", _NAVY),
    Sample("happy-frog", "HAPPY FROG", "RIBBIT", "frog", _OLIVE),
    Sample("cat-nap", "CAT NAP", "DO NOT DISTURB", "cat", _PINK),
    Sample("dogs-out", "WHO LET", "THE DOGS OUT", "dog", _BROWN),
    Sample("database-locked", "DATABASE LOCKED", "STAY CALM", "server", _PURPLE),
    Sample("merge-conflict", "MERGE CONFLICT", "RESOLVED", "bug", _RED),
    Sample("rainy-day", "RAINY DAY", "STAY INSIDE AND CODE", "cloud", _GREY),
    Sample("more-coffee", "MORE COFFEE", "MORE FEATURES", "coffee", _ORANGE),
    Sample("sleepy-dog", "SLEEPY DOG", "ZZZ", "dog", _SKY),
    Sample("pizza-cat", "CAT WANTS", "YOUR PIZZA", "cat", _GREEN),
    Sample("jiayou", "今天也要加油", "", "sun", _ORANGE, "cjk"),
    Sample("tai-nan-le", "我太难了", "", "cat", _GREY, "cjk"),
    Sample("moyu", "摸鱼快乐", "", "fish", _SKY, "cjk"),
    Sample("neng-pao", "代码能跑就行", "", "computer", _NAVY, "cjk"),
    Sample("zhouwu", "周五不上线", "", "server", _RED, "cjk"),
    Sample("xiaogou", "小狗真可爱", "", "dog", _PINK, "cjk"),
)

# near-duplicate file -> (source sample name, scale, JPEG quality)
NEAR_DUPLICATES: dict[str, tuple[str, float, int]] = {
    "build-passes-small.jpg": ("build-passes", 0.8, 70),
    "cheezburger-cat-recompressed.jpg": ("cheezburger-cat", 1.0, 55),
}
