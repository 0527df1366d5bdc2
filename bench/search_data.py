"""The search-quality benchmark's memes: captions, queries, styles, and a deterministic renderer.

Every meme has a caption (1-3 lines) drawn on the image, an ``exact`` query copied verbatim from
the caption and a hand-written ``paraphrase`` (same meaning, mostly other words). Twenty memes
also have a look-alike *twin* (resized, lightly cropped, re-compressed) used only as a visual query.

Everything is deterministic: per-meme choices come from ``random.Random(<meme id>)``; the same
Pillow/libjpeg versions write the same bytes on every run (:func:`write_dataset`). Display names
(``meme-<id>.png``) say nothing about the caption.
"""

from __future__ import annotations

import io
import json
import os
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from app.samples.render import SUBJECTS

# ---------------------------------------------------------------- the captions and queries
# (caption lines separated by " / ", exact query, paraphrase)
_EN: tuple[tuple[str, str, str], ...] = (
    ("When the build passes / on the first try", "build passes", "compiling worked immediately with no retries"),
    ("One does not simply / deploy on Friday", "deploy on Friday", "never ship to production right before the weekend"),
    ("Me on Monday morning / after a three day weekend", "Monday morning", "struggling to go back to work after a long holiday"),
    ("My cat when I / open a can of tuna", "can of tuna", "kitty sprinting to the kitchen for fish food"),
    ("It works / on my machine", "works on my machine", "the program only runs on the developer's own computer"),
    ("Coffee first / then we talk", "coffee first", "don't speak to me before my espresso"),
    ("It's not a bug / it's a feature", "not a bug", "pretending a mistake is intended behaviour"),
    ("This meeting could have been / an email", "could have been", "a pointless call that a short message would have covered"),
    ("Nobody: / Me at 3 am: / googling symptoms", "googling symptoms", "searching the web for illnesses in the middle of the night"),
    ("When you finally fix the bug / and three new ones appear", "three new ones", "repairing one error creates several more errors"),
    ("Diet starts / tomorrow", "diet starts tomorrow", "I will eat healthy some other day"),
    ("Homework due at midnight / me at 11:59", "homework due", "submitting the school assignment at the very last minute"),
    ("Who ate / the last slice of pizza", "last slice of pizza", "someone took the final piece of my pie"),
    ("My dog thinks / the mailman is a monster", "the mailman", "puppy barking at the postal worker"),
    ("Weekend plans: / sleep / repeat", "weekend plans", "doing nothing but napping on Saturday and Sunday"),
    ("Saving money / vs / online shopping at 2 am", "online shopping", "buying stuff on the internet late at night instead of saving"),
    ("When the wifi / goes down for five minutes", "wifi goes down", "internet outage feels like the end of the world"),
    ("Me explaining / my code to a rubber duck", "rubber duck", "talking to a bath toy to debug a program"),
    ("Mom said / wear a jacket", "wear a jacket", "mother insists I bundle up because it is chilly"),
    ("It's too hot / to function", "too hot to function", "the heatwave makes me useless"),
    ("Snow day / no school", "snow day", "classes cancelled because of the winter storm"),
    ("When your team / scores in the last minute", "last minute", "a late goal wins the match"),
    ("Gym on January first / vs gym on February first", "January first", "new year fitness resolutions fade quickly"),
    ("Payday / money gone by Tuesday", "money gone by Tuesday", "my salary disappears within a few days"),
    ("Me pretending to work / when the boss walks by", "boss walks by", "acting busy as the manager passes my desk"),
    ("git push --force / what could go wrong", "git push", "recklessly overwriting the remote repository history"),
    ("Reply all / to the whole company", "reply all", "accidentally emailing every employee"),
    ("I'm not lazy / I'm on energy saving mode", "energy saving mode", "resting to conserve my strength"),
    ("Santa checking / his list twice", "his list twice", "Father Christmas verifying who is naughty or nice"),
    ("Halloween candy / disappears before Halloween", "Halloween candy", "eating the trick or treat sweets early"),
    ("Thanksgiving plan: / eat turkey / take a nap", "eat turkey", "holiday feast followed by a snooze on the sofa"),
    ("When the code compiles / but you don't know why", "code compiles", "the program builds and I have no clue how"),
    ("Cats knocking things / off the table", "off the table", "a kitten pushing objects onto the floor"),
    ("The dog / ate my homework", "ate my homework", "puppy chewed up my school assignment"),
    ("Five more minutes", "five more minutes", "hitting the snooze button on the alarm again"),
    ("Me checking the fridge / every ten minutes", "checking the fridge", "looking for snacks in the kitchen over and over"),
    ("Stock market / only goes down when I buy", "stock market", "my investments crash right after I purchase shares"),
    ("Rain on my / only day off", "only day off", "bad weather ruins my one free day"),
    ("When the teacher says / pick a partner", "pick a partner", "group work in class and I have no friends"),
    ("Dad jokes / loading", "dad jokes", "father about to tell a corny pun"),
    ("Grandma: / you look hungry", "you look hungry", "grandmother keeps feeding me too much"),
    ("Writing code at 2 am / naming variables x and xx", "naming variables", "awful identifier names when coding late at night"),
    ("Stack Overflow / copy paste engineer", "copy paste engineer", "developer who copies answers from a forum"),
    ("Zoom call: / you're on mute", "on mute", "colleague talking with their microphone switched off"),
    ("Tabs vs spaces / the eternal war", "tabs vs spaces", "programmers arguing forever about indentation"),
    ("Free food / in the break room", "free food", "leftover snacks for staff in the office kitchen"),
    ("Out of office / do not disturb", "out of office", "on vacation and not answering emails"),
    ("Stuck in a traffic jam / late again", "traffic jam", "cars not moving on the road so I miss the start"),
    ("Me at the buffet: / one more plate", "one more plate", "all you can eat restaurant, going back for seconds"),
    ("When you see / your ex at the store", "your ex", "bumping into a former partner while shopping"),
    ("The floor is lava", "floor is lava", "kids game where you must not touch the ground"),
    ("Plot twist: / it was the cat all along", "plot twist", "surprise ending, the kitty was the culprit"),
    ("Exam tomorrow / haven't opened the book", "exam tomorrow", "the test is soon and I did not study at all"),
    ("Ten thousand steps / to the fridge", "ten thousand steps", "my daily walking goal is only trips to the kitchen"),
    ("Ctrl Z / in real life please", "ctrl z", "wishing I could undo a mistake outside the computer"),
    ("When the pizza / arrives early", "pizza arrives early", "the delivery came sooner than expected"),
    ("Me checking my / bank balance / after a night out", "bank balance", "how much cash is left after partying"),
    ("Autumn leaves / and pumpkin spice", "pumpkin spice", "fall season latte flavour"),
    ("Dogs are / better than people", "better than people", "puppies beat humans"),
    ("Cat: feed me / five minutes after dinner", "feed me", "kitty demanding food again right after eating"),
    ("Senior developer / reading junior code", "junior code", "experienced engineer reviewing a beginner's work"),
    ("Production is down / and it's my fault", "production is down", "I broke the live website"),
    ("Hello darkness / my old friend", "hello darkness", "greeting the gloom like an old pal"),
    ("I have no idea / what I'm doing", "no idea", "completely clueless about the task"),
    ("Spring cleaning: / found 40 dollars", "spring cleaning", "tidying the house and discovering cash"),
    ("Marathon runner / vs me running for the bus", "running for the bus", "sprinting to catch public transport"),
    ("When the referee / ignores the foul", "ignores the foul", "the umpire missed an obvious violation"),
    ("Sunburn after / ten minutes at the beach", "at the beach", "red skin from a short time in the sun by the sea"),
    ("Loading... / please wait", "please wait", "progress bar stuck forever"),
    ("Me: I'll sleep early / also me at 4 am", "sleep early", "promising to go to bed on time then staying up all night"),
    ("Bro really / said that", "really said that", "can't believe he told us that"),
    ("Big brain / time", "big brain", "genius idea moment"),
    ("Hold my beer", "hold my beer", "watch me try something dangerous"),
    ("Keep calm / and clear the cache", "clear the cache", "stay relaxed and delete the stored browser data"),
    ("Password must contain / a hieroglyph", "password must contain", "absurd login security rules"),
    ("The printer / never works when you need it", "the printer", "office printing machine broken at the worst time"),
    ("When mom finds / the report card", "report card", "parent discovering my bad school grades"),
    ("First day / at the new job", "new job", "starting work at a different company"),
    ("Friday at 5 pm: / freedom", "friday at 5 pm", "the working week is over and the weekend begins"),
    ("Sunday scaries", "sunday scaries", "anxiety the evening before the work week"),
    ("Kids these days / will never know dial up", "dial up", "young people never heard old modem internet"),
    ("Pineapple on pizza / is a crime", "pineapple on pizza", "tropical fruit topping should be illegal"),
    ("Shh / the baby is sleeping", "baby is sleeping", "be quiet, the infant is napping"),
    ("Cat on keyboard: / sdfghjkl", "cat on keyboard", "kitten typed gibberish by walking on my laptop"),
    ("Unit tests? / We don't do that here", "unit tests", "skipping automated code checks"),
    ("Tired at 3 pm: / the afternoon slump", "afternoon slump", "sleepy after lunch at work"),
    ("Wait, it's all memes? / Always has been", "always has been", "astronaut realizing it was that way forever"),
    ("Expectation vs reality: / my birthday cake", "expectation vs reality", "the baking turned out nothing like the picture"),
    ("New phone / who dis", "who dis", "changed my number, I don't recognise you"),
    ("Adulting / is hard", "adulting is hard", "grown-up responsibilities are tough"),
    ("When the group chat / goes silent", "group chat", "nobody replies to my message to friends"),
    ("Fish are friends / not food", "fish are friends", "sea creatures should not be eaten"),
    ("I survived / the Black Friday sale", "black friday", "made it through the discount shopping crowds"),
    ("It is Wednesday / my dudes", "wednesday my dudes", "it's the middle of the week, pals"),
    ("Error 404: / motivation not found", "motivation not found", "no desire to do anything"),
    ("Brain: remember that / embarrassing thing from 2009?", "embarrassing thing", "recalling an awkward memory years later"),
    ("Thunderstorm outside / the dog hides under the bed", "hides under the bed", "puppy scared of the storm noise"),
    ("Merge conflict / on the last day of the sprint", "merge conflict", "git branches clash right before the deadline"),
    ("When you laugh / at your own joke / and nobody else does", "your own joke", "nobody found my humor funny"),
    ("Birthday cake / more candles than cake", "more candles than cake", "getting old, too many candles"),
    ("Teacher: / this will be on the test", "on the test", "the exam will cover this material"),
    ("The wifi password / is on the fridge", "wifi password", "where to find the internet login at home"),
    ("Monday again? / Really?", "monday again", "the start of the week came back too soon"),
    ("When the dog / gives you puppy eyes", "puppy eyes", "dog begging with an adorable face"),
    ("Rocket science / is easier than taxes", "easier than taxes", "filling in tax forms is harder than space engineering"),
    ("Me when the / delivery guy calls", "delivery guy", "the courier phones me and I panic"),
)

_ZH: tuple[tuple[str, str, str], ...] = (
    ("打工人 / 打工魂 / 打工都是人上人", "打工人", "上班族的精神"),
    ("上班摸鱼 / 下班积极", "上班摸鱼", "工作时偷懒，一到下班就来劲"),
    ("抢红包 / 手速太慢了", "抢红包", "过年发的钱我总是抢不到"),
    ("内卷 / 卷不动了", "卷不动了", "竞争太激烈，我没力气了"),
    ("躺平 / 是我最后的倔强", "躺平", "放弃努力是我唯一的坚持"),
    ("今天也是 / 不想上班的一天", "不想上班", "又是讨厌去工作的日子"),
    ("我太难了", "我太难了", "生活真不容易"),
    ("周一综合症 / 又犯了", "周一综合症", "星期一开工特别难受"),
    ("奶茶续命 / 一天三杯", "奶茶续命", "每天靠喝好几杯珍珠饮料活着"),
    ("老板画的饼 / 我吃饱了", "画的饼", "领导许下的空头承诺"),
    ("加班到深夜 / 地铁都停了", "加班到深夜", "工作到很晚，没有末班车了"),
    ("双十一 / 钱包空了", "双十一", "购物节花钱太多"),
    ("猫主子 / 今天也不理我", "猫主子", "家里的喵星人对我很冷淡"),
    ("狗子 / 又拆家了", "拆家", "小狗把房子弄得一团糟"),
    ("考试周 / 通宵复习", "通宵复习", "整夜不睡准备期末"),
    ("寒假作业 / 写不完了", "写不完", "假期功课太多做不完"),
    ("我妈 / 又在催婚了", "催婚", "母亲逼我早点结婚"),
    ("过年回家 / 亲戚问工资", "亲戚问工资", "春节七大姑八大姨打听我挣多少钱"),
    ("程序员的头发 / 越来越少", "程序员", "写代码的人容易秃顶"),
    ("代码 / 能跑就行", "能跑就行", "程序别管写得多烂，运行起来就好"),
    ("删库跑路 / 了解一下", "删库跑路", "删掉数据库然后逃走"),
    ("今天天气真好 / 适合睡觉", "适合睡觉", "阳光明媚正好补觉"),
    ("下雨天 / 和火锅最配", "火锅最配", "阴雨天气就该吃麻辣锅"),
    ("热到融化 / 空调续命", "热到融化", "天气太闷热，只能靠冷气活着"),
    ("月底吃土 / 工资还没发", "月底吃土", "月末没钱只能省吃俭用"),
    ("国足又输了 / 早就习惯了", "国足又输了", "中国男子足球队再次败北"),
    ("凡尔赛文学 / 我也太瘦了吧", "凡尔赛", "假装抱怨其实在炫耀"),
    ("说好不吃 / 结果真香", "真香", "嘴上拒绝后来却很喜欢"),
    ("社恐的我 / 不敢打电话点外卖", "社恐", "害怕和人交流，连叫餐都怕"),
    ("外卖小哥 / 迟到了半小时", "外卖小哥", "送餐员晚了三十分钟"),
    ("熬夜冠军 / 明天再说", "熬夜冠军", "最晚睡觉的人"),
    ("定了五个闹钟 / 还是迟到", "五个闹钟", "设了好几次提醒也没起床"),
    ("老师拖堂 / 下课铃没用", "拖堂", "老师讲课超时不放学"),
    ("emo了 / 今天不想说话", "emo了", "心情低落不想跟人聊天"),
    ("为你打call / 冲鸭", "打call", "给你加油支持你"),
    ("yyds / 永远的神", "永远的神", "最厉害的偶像"),
    ("996是福报 / 我信你个鬼", "福报", "长时间工作被说成好事，我不相信"),
    ("社畜的周末 / 只想躺着", "社畜", "上班族休息日只想待在床上"),
    ("春运抢票 / 又没抢到", "春运抢票", "过年回家的火车票买不到"),
    ("干饭人 / 干饭魂", "干饭人", "吃饭最积极的人"),
    ("我不要你觉得 / 我要我觉得", "我要我觉得", "只听自己的意见"),
    ("这家奶茶 / 绝绝子", "绝绝子", "这个饮料太好喝了"),
    ("看到这条评论 / 我破防了", "破防了", "被一句留言戳中，情绪崩溃"),
    ("尊嘟假嘟 / O.o", "尊嘟假嘟", "真的还是假的"),
    ("每天都在 / 精神内耗", "精神内耗", "心里反复纠结消耗自己"),
    ("坏运气 / 退退退", "退退退", "霉运走开"),
    ("熊孩子 / 又在飞机上踢座椅", "熊孩子", "调皮的小孩在航班上踢椅背"),
    ("大妈的广场舞 / 音响比我还大声", "广场舞", "阿姨们晚上跳舞的音乐太吵"),
    ("中秋节 / 五仁月饼又来了", "五仁月饼", "过节收到不好吃的坚果馅点心"),
    ("基金又亏了 / 韭菜本菜", "基金又亏了", "理财产品还在赔钱"),
    ("朋友圈 / 仅三天可见", "三天可见", "社交动态只展示最近几天"),
    ("已读不回 / 心好累", "已读不回", "看了消息却不理我"),
    ("柠檬精 / 我酸了", "柠檬精", "羡慕嫉妒别人"),
    ("上课偷偷 / 玩手机被抓", "玩手机", "课堂上用电话被老师发现"),
    ("需求又改了 / 产品经理你过来", "需求又改了", "项目要求再次变动，找负责人算账"),
    ("周五下午 / 心已经下班了", "心已经下班", "星期五还没下班就没心思工作"),
    ("年终奖 / 发了个寂寞", "年终奖", "年底奖金几乎没有"),
    ("再打一把 / 就睡觉", "再打一把", "最后玩一局游戏然后休息"),
    ("高铁上 / 有人占我座位", "占我座位", "火车上别人坐了我的位置"),
    ("周末加班 / 没有加班费", "加班费", "休息日工作却不给额外报酬"),
    ("今天也要 / 开心鸭", "开心鸭", "每天都要快乐"),
    ("过个年 / 我又胖了三斤", "胖了三斤", "春节后体重增加"),
    ("Deadline / 是第一生产力", "第一生产力", "截止日期逼人干活最有效"),
    ("又要做PPT / 熬到凌晨三点", "做PPT", "写演示文稿到半夜"),
)

STYLES: tuple[str, ...] = ("plain", "impact", "color", "small", "topbottom", "subject")

# ids of the memes that get a look-alike twin: 10 per language, every style, 4 in the gate subset
TWIN_IDS: tuple[str, ...] = tuple(f"en-{i:03d}" for i in (3, 14, 25, 40, 47, 58, 69, 80, 91, 102)) + tuple(
    f"zh-{i:03d}" for i in (2, 9, 16, 23, 30, 33, 37, 44, 51, 58)
)


@dataclass(frozen=True)
class Meme:
    """One benchmark meme: what is drawn, how, and the two queries that should find it."""

    id: str
    lang: str  # "en" | "zh"
    lines: tuple[str, ...]
    exact: str
    paraphrase: str
    style: str
    subject: str
    width: int
    height: int
    fmt: str  # "png" | "jpeg"

    @property
    def caption(self) -> str:
        """The caption's lines joined by spaces (as drawn, before any upper-casing)."""
        return " ".join(self.lines)

    @property
    def drawn_lines(self) -> tuple[str, ...]:
        """The lines as drawn: the Impact-like styles upper-case Latin letters."""
        if self.style in ("impact", "topbottom"):
            return tuple(line.upper() for line in self.lines)
        return self.lines

    @property
    def filename(self) -> str:
        """Neutral display name: never says what the caption is."""
        return f"meme-{self.id}.{'jpg' if self.fmt == 'jpeg' else 'png'}"

    @property
    def twin_filename(self) -> str:
        return f"twin-{self.id}.jpg"

    @property
    def has_twin(self) -> bool:
        return self.id in TWIN_IDS


def _build(lang: str, rows: Sequence[tuple[str, str, str]]) -> list[Meme]:
    subjects = sorted(SUBJECTS)
    out: list[Meme] = []
    for i, (caption, exact, paraphrase) in enumerate(rows, start=1):
        mid = f"{lang}-{i:03d}"
        rng = random.Random(mid)
        style = STYLES[(i - 1 + (2 if lang == "zh" else 0)) % len(STYLES)]
        width = rng.randrange(360, 801, 20)
        height = int(width * rng.choice((0.6, 0.75, 0.85, 1.0, 1.1)))
        out.append(Meme(
            id=mid, lang=lang, lines=tuple(part.strip() for part in caption.split(" / ")),
            exact=exact, paraphrase=paraphrase, style=style, subject=rng.choice(subjects),
            width=width, height=height, fmt="jpeg" if i % 5 == 0 else "png",
        ))
    return out


MEMES: tuple[Meme, ...] = tuple(_build("en", _EN) + _build("zh", _ZH))
BY_ID: dict[str, Meme] = {m.id: m for m in MEMES}

# The quality-gate subset: 12 per language covering every style twice.
SUBSET_IDS: tuple[str, ...] = tuple(
    [f"en-{i:03d}" for i in (*range(1, 7), *range(37, 43))]
    + [f"zh-{i:03d}" for i in (*range(1, 7), *range(31, 37))]
)


def memes(*, subset: bool = False) -> list[Meme]:
    """All benchmark memes, or the quality-gate subset."""
    if subset:
        return [BY_ID[i] for i in SUBSET_IDS]
    return list(MEMES)


def _normalize(text: str) -> str:
    return re.sub(r"\s+", " ", text.lower()).strip()


def check_dataset() -> list[str]:
    """Problems with the data (empty when sound): exact queries copied from their own caption and
    found in no other caption; ids unique; counts as the benchmark promises."""
    problems: list[str] = []
    for m in MEMES:
        own = _normalize(m.caption) if m.lang == "en" else [_normalize(line) for line in m.lines]
        q = _normalize(m.exact)
        if m.lang == "en":
            if not re.search(rf"(?<!\w){re.escape(q)}(?!\w)", own):
                problems.append(f"{m.id}: exact {m.exact!r} not in caption")
            n_words = len(q.split())
            if not 1 <= n_words <= 4:
                problems.append(f"{m.id}: exact has {n_words} words")
        else:
            if not any(q in line for line in own):
                problems.append(f"{m.id}: exact {m.exact!r} not in one caption line")
        for other in MEMES:
            if other.id != m.id and q in _normalize("".join(other.lines) if m.lang == "zh" else other.caption):
                if m.lang == "en" and not re.search(rf"(?<!\w){re.escape(q)}(?!\w)", _normalize(other.caption)):
                    continue
                problems.append(f"{m.id}: exact {m.exact!r} also in {other.id}")
        if not 1 <= len(m.lines) <= 3:
            problems.append(f"{m.id}: {len(m.lines)} lines")
    if len(BY_ID) != len(MEMES):
        problems.append("duplicate ids")
    if sum(m.lang == "en" for m in MEMES) < 100 or sum(m.lang == "zh" for m in MEMES) < 55:
        problems.append("too few memes")
    if len(TWIN_IDS) != 20 or any(t not in BY_ID for t in TWIN_IDS):
        problems.append("twins must be 20 known ids")
    return problems


# ---------------------------------------------------------------- rendering
_FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")
_LATIN_FONTS: dict[str, tuple[str, ...]] = {
    "plain": ("DejaVuSans.ttf", "DejaVuSerif.ttf", "DejaVuSansMono.ttf"),
    "impact": ("DejaVuSans-Bold.ttf", "DejaVuSansCondensed-Bold.ttf"),
    "color": ("DejaVuSans-Bold.ttf", "DejaVuSerif-Bold.ttf", "DejaVuSans-Oblique.ttf", "DejaVuSansMono-Bold.ttf"),
    "small": ("DejaVuSans.ttf", "DejaVuSansCondensed.ttf", "DejaVuSerif.ttf"),
    "topbottom": ("DejaVuSans-Bold.ttf", "DejaVuSansCondensed-Bold.ttf"),
    "subject": ("DejaVuSans-Bold.ttf", "DejaVuSerifCondensed-Bold.ttf"),
}
_BACKGROUNDS = ((52, 101, 164), (32, 45, 84), (22, 130, 128), (46, 125, 50), (106, 61, 154),
                (178, 34, 52), (214, 110, 20), (121, 85, 61), (84, 90, 98), (196, 68, 128),
                (110, 120, 30), (70, 150, 210))
# (background, text) pairs with enough contrast to read
_COLOR_PAIRS = (((255, 214, 0), (30, 30, 120)), ((20, 40, 90), (255, 200, 60)),
                ((240, 240, 230), (200, 30, 40)), ((30, 120, 60), (255, 255, 255)),
                ((250, 200, 210), (90, 20, 70)), ((40, 40, 40), (120, 230, 120)),
                ((200, 230, 255), (10, 60, 140)), ((255, 140, 0), (20, 20, 20)))
_PASTELS = ((245, 245, 240), (235, 245, 255), (255, 245, 230), (240, 255, 240), (250, 240, 250))
_WHITE, _BLACK = (255, 255, 255), (0, 0, 0)


def _font_path(meme: Meme, rng: random.Random) -> Path:
    if meme.lang == "zh":
        from app.samples.fonts import find_font

        return find_font("cjk")
    return _FONT_DIR / rng.choice(_LATIN_FONTS[meme.style])


def _fit(d: ImageDraw.ImageDraw, lines: Sequence[str], path: Path, start: int, max_w: int,
         max_h: int, stroke: int, floor: int) -> ImageFont.FreeTypeFont:
    size = start
    while True:
        font = ImageFont.truetype(str(path), size)
        widths = [d.textbbox((0, 0), ln, font=font, stroke_width=stroke) for ln in lines]
        total_h = sum(b[3] - b[1] for b in widths) + (len(lines) - 1) * size // 3
        if size <= floor or (max(b[2] - b[0] for b in widths) <= max_w and total_h <= max_h):
            return font
        size -= 1


def _draw_block(d: ImageDraw.ImageDraw, lines: Sequence[str], font: ImageFont.FreeTypeFont,
                width: int, top: int, *, fill, stroke: int = 0, stroke_fill=None) -> int:
    """Draw centred lines from y=top; returns the y below the block."""
    gap = font.size // 3
    y = top
    for ln in lines:
        left, t, right, b = d.textbbox((0, 0), ln, font=font, stroke_width=stroke)
        d.text(((width - (right - left)) // 2 - left, y - t), ln, font=font, fill=fill,
               stroke_width=stroke, stroke_fill=stroke_fill)
        y += (b - t) + gap
    return y - gap


def _block_height(d: ImageDraw.ImageDraw, lines: Sequence[str], font, stroke: int = 0) -> int:
    hs = [d.textbbox((0, 0), ln, font=font, stroke_width=stroke) for ln in lines]
    return sum(b[3] - b[1] for b in hs) + (len(lines) - 1) * (font.size // 3)


def _shapes(d: ImageDraw.ImageDraw, rng: random.Random, w: int, h: int, base) -> None:
    for _ in range(rng.randint(3, 7)):
        x, y = rng.randrange(w), rng.randrange(h)
        r = rng.randint(20, max(30, w // 5))
        shade = tuple(max(0, min(255, c + rng.randint(-60, 60))) for c in base)
        if rng.random() < 0.5:
            d.ellipse([x - r, y - r, x + r, y + r], fill=shade)
        else:
            d.rectangle([x - r, y - r // 2, x + r, y + r // 2], fill=shade)


def render(meme: Meme) -> Image.Image:
    """Draw ``meme`` as an RGB image (deterministic for a given meme)."""
    rng = random.Random(f"render:{meme.id}")
    w, h = meme.width, meme.height
    lines = meme.drawn_lines
    path = _font_path(meme, rng)
    margin = max(12, w // 30)
    style = meme.style
    if style == "plain":
        img = Image.new("RGB", (w, h), _WHITE)
        d = ImageDraw.Draw(img)
        font = _fit(d, lines, path, w // 11, w - 2 * margin, h - 2 * margin, 0, 14)
        _draw_block(d, lines, font, w, (h - _block_height(d, lines, font)) // 2, fill=_BLACK)
    elif style == "impact":
        base = rng.choice(_BACKGROUNDS)
        img = Image.new("RGB", (w, h), base)
        d = ImageDraw.Draw(img)
        _shapes(d, rng, w, h, base)
        stroke = max(2, w // 160)
        font = _fit(d, lines, path, w // 9, w - 2 * margin, h - 2 * margin, stroke, 16)
        _draw_block(d, lines, font, w, (h - _block_height(d, lines, font, stroke)) // 2,
                    fill=_WHITE, stroke=stroke, stroke_fill=_BLACK)
    elif style == "color":
        bg, fg = rng.choice(_COLOR_PAIRS)
        img = Image.new("RGB", (w, h), bg)
        d = ImageDraw.Draw(img)
        font = _fit(d, lines, path, w // 10, w - 2 * margin, h - 2 * margin, 0, 16)
        top = rng.choice(((h - _block_height(d, lines, font)) // 2, margin * 2))
        _draw_block(d, lines, font, w, top, fill=fg)
    elif style == "small":
        img = Image.new("RGB", (w, h), rng.choice(_PASTELS))
        d = ImageDraw.Draw(img)
        SUBJECTS[meme.subject](d, w // 2, h // 2 - 10)
        size = rng.randint(14, 18) + (2 if meme.lang == "zh" else 0)
        font = _fit(d, lines, path, size, w - 2 * margin, h // 3, 0, 12)
        bh = _block_height(d, lines, font)
        top = h - margin - bh if rng.random() < 0.6 else margin
        _draw_block(d, lines, font, w, top, fill=(30, 30, 30))
    elif style == "topbottom":
        base = rng.choice(_BACKGROUNDS)
        img = Image.new("RGB", (w, h), base)
        d = ImageDraw.Draw(img)
        r, g, b = base
        d.rounded_rectangle([w // 4, h // 4, w - w // 4, h - h // 4], radius=18,
                            fill=(min(r + 40, 255), min(g + 40, 255), min(b + 40, 255)))
        SUBJECTS[meme.subject](d, w // 2, h // 2)
        top_lines, bottom_lines = lines[:1], lines[1:]
        stroke = max(2, w // 180)
        font = _fit(d, lines, path, w // 10, w - 2 * margin, h // 2 - 2 * margin, stroke, 16)
        _draw_block(d, top_lines, font, w, margin, fill=_WHITE, stroke=stroke, stroke_fill=_BLACK)
        if bottom_lines:
            bh = _block_height(d, bottom_lines, font, stroke)
            _draw_block(d, bottom_lines, font, w, h - margin - bh, fill=_WHITE, stroke=stroke,
                        stroke_fill=_BLACK)
    else:  # "subject": the text crosses the drawn subject
        img = Image.new("RGB", (w, h), rng.choice(_PASTELS))
        d = ImageDraw.Draw(img)
        for dx in (-w // 4, w // 4) if w >= 500 else (0,):
            SUBJECTS[meme.subject](d, w // 2 + dx, h // 2)
        stroke = max(2, w // 200)
        font = _fit(d, lines, path, w // 11, w - 2 * margin, h - 2 * margin, stroke, 16)
        fill = rng.choice(((255, 255, 255), (255, 230, 0)))
        _draw_block(d, lines, font, w, (h - _block_height(d, lines, font, stroke)) // 2,
                    fill=fill, stroke=stroke, stroke_fill=_BLACK)
    return img


def render_twin(meme: Meme, original: Image.Image | None = None) -> bytes:
    """The look-alike twin's JPEG bytes: resized, cropped by at most 5 %, re-compressed."""
    rng = random.Random(f"twin:{meme.id}")
    img = original if original is not None else render(meme)
    w, h = img.size
    cx, cy = int(w * rng.uniform(0.0, 0.025)), int(h * rng.uniform(0.0, 0.025))
    img = img.crop((cx, cy, w - int(w * rng.uniform(0.0, 0.025)), h - int(h * rng.uniform(0.0, 0.025))))
    scale = rng.choice((0.6, 0.75, 0.9, 1.25))
    img = img.resize((round(img.width * scale), round(img.height * scale)), Image.Resampling.LANCZOS)
    return _encode(img, "jpeg", rng.choice((60, 70, 80)))


def _encode(img: Image.Image, fmt: str, quality: int = 90) -> bytes:
    buf = io.BytesIO()
    if fmt == "jpeg":
        img.save(buf, format="JPEG", quality=quality, optimize=False, progressive=False)
    else:
        img.save(buf, format="PNG", optimize=False, compress_level=6)
    return buf.getvalue()


def encode(meme: Meme) -> bytes:
    """The meme's file bytes (PNG, or JPEG quality 90 for every fifth meme)."""
    return _encode(render(meme), meme.fmt)


@dataclass(frozen=True)
class Written:
    """What :func:`write_dataset` wrote: the memes to upload and the twin files (visual queries)."""

    directory: Path
    images: dict[str, Path]  # meme id -> file
    twins: dict[str, Path]   # meme id of the original -> twin file
    manifest: Path


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_dataset(out_dir: Path | str, chosen: Iterable[Meme] | None = None) -> Written:
    """Write the memes (``images/``), their twins (``twins/``, never to be uploaded) and a
    ``manifest.json`` with captions and queries into ``out_dir``. Same bytes on every run."""
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    (out / "twins").mkdir(parents=True, exist_ok=True)
    selected = list(MEMES if chosen is None else chosen)
    images: dict[str, Path] = {}
    twins: dict[str, Path] = {}
    for meme in selected:
        img = render(meme)
        path = out / "images" / meme.filename
        _write_atomic(path, _encode(img, meme.fmt))
        images[meme.id] = path
        if meme.has_twin:
            tpath = out / "twins" / meme.twin_filename
            _write_atomic(tpath, render_twin(meme, img))
            twins[meme.id] = tpath
    manifest = out / "manifest.json"
    _write_atomic(manifest, json.dumps([
        {"id": m.id, "lang": m.lang, "lines": list(m.lines), "exact": m.exact,
         "paraphrase": m.paraphrase, "style": m.style, "file": m.filename,
         "twin": m.twin_filename if m.has_twin else None}
        for m in selected
    ], ensure_ascii=False, indent=1).encode())
    return Written(out, images, twins, manifest)


if __name__ == "__main__":  # pragma: no cover - a preview helper
    import sys

    problems = check_dataset()
    print("\n".join(problems) or "dataset ok")
    if len(sys.argv) > 1:
        w = write_dataset(sys.argv[1])
        print(f"wrote {len(w.images)} memes and {len(w.twins)} twins to {w.directory}")
