"""Held-out memes for the internet-slang glossary (document version 5).

Written BLIND on 2026-12-02 (branch ``heldout``): the author had not opened
app/search/data/slang_zh.tsv, slang_en.tsv, app/search/slang.py,
tests/unit/test_slang.py, bench/search_data.py or docs/search.md when this
file was written and committed.  The slang was chosen from general knowledge
of Chinese / English internet usage (2015-2025), not from the glossary.

Each meme: id, lang ("zh"/"en"), group ("zh-slang", "zh-plain", "en"),
slang (bool: the caption leans on an internet-slang term), caption (the text
on the meme) and paraphrase (a query meaning the same thing in mostly
different, plain words; it never repeats the slang term).
"""

from __future__ import annotations

_ZH_SLANG = [
    ("我真的会谢，这班谁爱上谁上", "真让人无语，这份工作谁想干谁去干"),
    ("绝绝子！这杯奶茶yyds", "这杯奶茶太好喝了，是最好的"),
    ("家人们谁懂啊，刚下班又被老板叫回去", "大家能理解吗，已经下班了领导又让我回公司"),
    ("破防了，考试又挂了", "心理防线崩溃，考试没有及格"),
    ("躺平了，卷不动了", "放弃奋斗，不想再跟别人拼命竞争"),
    ("芭比Q了，作业一个字还没写", "完蛋了，作业还没开始做"),
    ("栓Q，我真的栓Q", "无语到极点的反讽式感谢"),
    ("我emo了，今晚谁也别找我", "心情低落难过，今晚不想和人说话"),
    ("打工人，打工魂，打工都是人上人", "上班族每天辛苦干活还要自我安慰"),
    ("卷王连周末都在图书馆", "竞争太激烈，有人周末也在拼命学习"),
    ("摸鱼中，勿扰", "上班时间偷懒，别来打扰我"),
    ("凡尔赛一下：唉，钱太多也是一种烦恼", "假装抱怨其实在炫耀自己有钱"),
    ("社死现场，在电梯里放了个屁", "当众出丑，尴尬得想找个地缝钻进去"),
    ("你这是在PUA我吗？", "你是不是在用话术精神控制我"),
    ("小丑竟是我自己", "原来闹笑话被耍的人是我"),
    ("奥利给！干就完了", "加油冲，别犹豫直接去做"),
    ("我太南了", "我的日子实在太不容易了"),
    ("柠檬精又酸了", "看到别人过得好就羡慕嫉妒"),
    ("我王境泽就是饿死，也不吃你们一点东西……真香", "嘴上说死也不要，结果后来觉得很好吃"),
    ("杠精退散", "故意唱反调爱抬杠的人走开"),
    ("这波操作666", "这一手玩得太厉害了"),
    ("蚌埠住了，哈哈哈哈", "实在忍不住了，笑得停不下来"),
    ("awsl，猫猫太可爱了", "小猫可爱到让我受不了"),
    ("纯纯大冤种", "白白吃亏的倒霉蛋就是我"),
    ("润了润了，这地方待不下去了", "准备逃离，跑路去别的地方"),
    ("尊嘟假嘟？", "真的还是假的"),
    ("班味太重了，周末都洗不掉", "上班带来的疲惫感，休息日也缓不过来"),
    ("遥遥领先！", "远远超过其他所有人"),
    ("显眼包本包", "特别爱出风头、引人注目的人"),
    ("泰裤辣！", "这也太酷了吧"),
    ("i人今天又不想出门社交", "性格内向的人不想出去见人"),
    ("city不city啊？", "这地方时不时髦、洋不洋气"),
    ("偷感很重的一个人", "做事鬼鬼祟祟生怕被人发现"),
    ("搞钱要紧，恋爱脑退散", "先赚钱，别被爱情冲昏头脑"),
    ("嗑到了嗑到了，这对CP好甜", "我很喜欢这对情侣组合，太甜蜜了"),
    ("爷青回！", "我的青春又回来了"),
    ("yue了，这也太油了", "恶心想吐，这人太油腻了"),
    ("扎心了，老铁", "朋友，这话太伤人了"),
    ("吃瓜群众表示看不懂", "在旁边看热闹的人一脸迷惑"),
    ("道心破碎", "信念彻底崩溃了"),
    ("一整个爱住", "实在太喜欢了"),
    ("这很难评", "不好评价，说不出话"),
    ("哈基米又在拆家", "家里的猫咪又在搞破坏"),
    ("真的会栓Q，老板画的饼又大又圆", "领导又在许下不会兑现的空头承诺"),
]

_ZH_PLAIN = [
    ("今天又是加班到深夜的一天", "工作到很晚才下班回家"),
    ("我只是一只可爱的小猫咪", "萌宠装无辜"),
    ("周一早上不想起床", "星期一赖在床上"),
    ("这个月的工资又花光了", "月底没钱了"),
    ("老师，我的作业被狗吃了", "找借口说没交功课"),
    ("减肥从明天开始", "今天先吃，以后再节食"),
    ("谢谢你，我很感动", "感激被打动了"),
    ("我先睡了，明天再说", "去休息，事情以后处理"),
    ("这道题我不会做", "题目太难解不出来"),
    ("我太难过了，想哭", "伤心得要流眼泪"),
    ("下雨了，不想出门", "天气不好，在家待着"),
    ("生日快乐，祝你天天开心", "祝贺你的诞辰，每天快乐"),
    ("我饿了，想吃火锅", "肚子空了，想吃麻辣涮锅"),
    ("请不要打扰我学习", "正在读书，别来烦我"),
    ("今天的我也很努力", "每天都在认真奋斗"),
    ("对不起，是我的错", "道歉，承认过失"),
    ("早上好，新的一天开始了", "清晨的问候"),
    ("我不想上学", "讨厌去学校"),
    ("什么都不想做", "没有动力，只想发呆"),
    ("你在干什么？", "询问对方在忙些什么"),
    ("好的，收到", "明白了，确认消息"),
    ("别看了，快去睡觉", "不要玩手机了，该休息了"),
    ("我要去旅行了，再见", "出门游玩，告别"),
    ("这个价格太贵了，买不起", "东西太昂贵，没钱买"),
    ("放假了，终于可以休息了", "假期开始，可以放松"),
    ("我很生气，后果很严重", "非常愤怒的警告"),
    ("你怎么还不回我消息", "对方一直不回复"),
    ("考试加油，一定能过", "祝测验顺利通过"),
    ("今天天气真好，适合出去玩", "阳光明媚，外出游玩"),
    ("我爱学习，学习使我快乐", "喜欢读书，读书让人开心"),
]

# (caption, paraphrase, slang?)
_EN = [
    ("It's Monday again and I'm already tired", "exhausted at the start of the work week", False),
    ("No cap, this is the best pizza ever", "honestly the greatest pizza I have had", True),
    ("When the code works on the first try", "program runs without errors the first time", False),
    ("I'm not lazy, I'm in energy saving mode", "excuse for resting to conserve power", False),
    ("This is fine", "everything around is burning but pretending to be calm", False),
    ("Big mood", "a very relatable feeling", True),
    ("Sir, this is a Wendy's", "you are ranting in the wrong place", True),
    ("It's giving main character energy", "acting like the star of the story", True),
    ("Bro really thought he ate", "he believed he did great but he didn't", True),
    ("Go touch grass", "get off the internet and go outside", True),
    ("Ok boomer", "dismissing an older person's opinion", True),
    ("Caught in 4K", "clear video evidence of someone doing something wrong", True),
    ("Living rent free in my head", "I can't stop thinking about it", True),
    ("That's kinda sus", "that looks suspicious", True),
    ("I'm dead 💀", "laughing so hard", True),
    ("Lowkey want to quit my job", "secretly want to resign from work", True),
    ("Stonks", "investment going up, profit", True),
    ("Not me crying over a dog video", "I got emotional watching a puppy clip", True),
    ("Why are you the way that you are", "why do you behave like this", False),
    ("Slay, queen", "you did amazing, girl", True),
    ("When you hear the ice cream truck", "kids running out to buy dessert from the van", False),
    ("Nobody: / Me at 3am: eating cereal", "late night snacking alone", True),
    ("I can't adult today", "too tired for grown-up responsibilities", True),
    ("Delulu is the solulu", "fantasy thinking fixes everything", True),
    ("Happy Friday, the weekend is here", "celebrating the end of the work week", False),
    ("Brain not braining", "can't think clearly", True),
    ("He's so extra", "over the top and dramatic", True),
    ("One does not simply walk into Mordor", "some things are not that easy", False),
    ("Thank u, next", "moving on from an ex", True),
    ("It be like that sometimes", "that's just how life goes", True),
    ("Skill issue", "you lost because you are bad at it", True),
    ("Mom said it's my turn on the Xbox", "siblings fighting over the video game console", False),
    ("I did not sign up for this", "I never agreed to this situation", False),
    ("Ratio + L + you fell off", "your post got more replies than likes, you lost relevance", True),
    ("I need coffee before I talk to anyone", "caffeine first, conversation later", False),
    ("Vibe check failed", "the mood test went badly", True),
    ("Sleep is for the weak", "staying up all night", False),
    ("Sorry I'm late, traffic was terrible", "apology for the delay because of road congestion", False),
    ("That's cap", "that is a lie", True),
    ("Weekend plans: sleep", "resting all Saturday and Sunday", False),
    ("Rizz god", "extremely smooth at flirting", True),
    ("Me pretending to listen in the meeting", "zoning out during a work call", False),
]


def _build() -> list[dict]:
    memes: list[dict] = []
    for i, (cap, para) in enumerate(_ZH_SLANG, 1):
        memes.append({"id": f"ho-zs-{i:03d}", "lang": "zh", "group": "zh-slang",
                      "slang": True, "caption": cap, "paraphrase": para})
    for i, (cap, para) in enumerate(_ZH_PLAIN, 1):
        memes.append({"id": f"ho-zp-{i:03d}", "lang": "zh", "group": "zh-plain",
                      "slang": False, "caption": cap, "paraphrase": para})
    for i, (cap, para, slang) in enumerate(_EN, 1):
        memes.append({"id": f"ho-en-{i:03d}", "lang": "en", "group": "en",
                      "slang": slang, "caption": cap, "paraphrase": para})
    return memes


HELDOUT_MEMES: list[dict] = _build()
