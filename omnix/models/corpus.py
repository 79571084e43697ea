"""The built-in text the tiny tokenizer is trained on.

Owns: one small, fixed corpus (original prose written for omnix: a few
kilobytes of English dialogue, numbers, code-ish text and some non-ASCII
words so multi-byte UTF-8 merges exist).  Changing a single character
changes the tokenizer and therefore every tiny model's bytes: bump
``CORPUS_VERSION`` when editing it.  Does not own training (``tokenizer.py``).
"""

from __future__ import annotations

CORPUS_VERSION = 1

CORPUS = """\
Hello! How are you today? I am fine, thank you. What would you like to talk about?
The weather is nice this morning. The sun is out and the wind is soft.
Please tell me a short story about a cat who lives in a lighthouse.
Once upon a time, a small grey cat lived at the top of an old lighthouse by the sea.
Every night the cat watched the lamp turn and the ships pass in the dark.
One evening a storm came, and the lamp went out. The cat climbed the stairs and rang the bell.
The sailors heard the bell, turned their ship, and reached the harbour safely.
In the morning the keeper gave the cat a bowl of fish and a warm blanket.
Can you explain how a pipeline of models works? Sure. A request enters the first stage.
The thinker writes text. The talker turns text into audio codes. The decoder turns codes into sound.
Each stage streams its output to the next one, so the first sentence is spoken while the rest is written.
If the client goes away, every stage is cancelled, and nothing more is produced.
What is the time? It is half past seven in the evening.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 42 100 256 1024 2048 24000.
Dates like 2024-05-17 and times like 12:30:45 appear in logs.
def add(a, b):
    return a + b

for i in range(10):
    print(i * i)

{"role": "user", "content": "Draw a red circle on a white background."}
{"role": "assistant", "content": "Here is a red circle on a white background."}
A picture of a mountain lake at sunrise, with pine trees and a small wooden boat.
A painting of a city street in the rain, with yellow lights and people holding umbrellas.
A photo of a bowl of fruit: apples, pears, grapes and a banana on a blue table.
Good morning. Good afternoon. Good evening. Good night. See you tomorrow.
Thank you very much! You are welcome. No problem at all. Have a great day.
Why is the sky blue? Sunlight is scattered by the air, and blue light is scattered the most.
How do birds fly? They push air down with their wings, and the air pushes them up.
Where do rivers go? Most rivers flow downhill until they reach a lake or the sea.
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
Café, naïve, résumé, façade, über, smörgåsbord, piñata, crème brûlée.
Grüße aus München. Très bien, merci. ¿Dónde está la biblioteca? Добрый день.
你好，世界。今天天气很好。 こんにちは。ありがとう。 안녕하세요.
Music notes: do re mi fa sol la si do. Colours: red, orange, yellow, green, blue, violet.
The train leaves at nine. The bus arrives at ten. The plane lands at noon.
She said, "Let's meet at the library." He answered, "I'll be there at four."
Questions and answers, sentences and words, letters and sounds: that is what language is made of.
"""  # noqa: RUF001 (the full-width comma is corpus text on purpose)

# Sentences used to check that encode/decode round-trips (they include text
# outside the corpus on purpose: byte-level BPE must still round-trip it).
ROUNDTRIP_SAMPLES = (
    "Hello! How are you today?",
    "A red circle on a white background, 64x64 pixels.",
    "Unseen words: zyxwvut, quixotic, 🙂 emoji, tab\tand newline\nend.",
    "Grüße, naïve café — 你好 こんにちは 안녕",
    "  leading and trailing spaces  ",
    "",
)
