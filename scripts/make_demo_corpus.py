#!/usr/bin/env python3
"""Regenerate mmrun's demo corpus and its byte-level BPE files, deterministically.

Writes, into --output-dir (default: data/corpus/ of this checkout):
  demo_corpus.jsonl   English prose from a seeded grammar, one {"text": ...} document per line
  gpt2-vocab.json     byte-level BPE vocabulary trained on it (with <|endoftext|>)
  gpt2-merges.txt     its merges, in GPT-2's file format

Nothing is downloaded: the prose comes from the word lists and templates below, so the corpus is
free of third-party text, and the same seed gives byte-identical files (a test checks that).

    python scripts/make_demo_corpus.py                 # rewrite the shipped files
    python scripts/make_demo_corpus.py --output-dir /tmp/corpus --documents 200
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys

from mmrun.common.atomic_write import atomic_write

SEED = 1234
DOCUMENTS = 560
VOCAB_SIZE = 1536
EOD = "<|endoftext|>"

# name -> (subject, object, possessive) pronouns, so that a story keeps its person's pronouns.
PEOPLE = {
    "Anna": "she", "Ben": "he", "Clara": "she", "David": "he", "Elena": "she", "Felix": "he",
    "Grace": "she", "Henry": "he", "Iris": "she", "Jonas": "he", "Kate": "she", "Leo": "he",
    "Maria": "she", "Noah": "he", "Olivia": "she", "Peter": "he", "Quinn": "they", "Rosa": "she",
    "Samuel": "he", "Tara": "she", "Victor": "he", "Wendy": "she",
}
PRONOUNS = {"she": ("she", "her", "her"), "he": ("he", "him", "his"), "they": ("they", "them", "their")}
NAMES = list(PEOPLE)
TOWNS = [
    "Millbrook", "Ashford", "Riverton", "Stonebridge", "Fairhaven", "Oakdale", "Westmere",
    "Larkspur", "Greywater", "Hollow Creek",
]
DWELLINGS = ["house", "cottage", "flat", "farmhouse", "cabin", "apartment", "old mill"]
LANDMARKS = ["river", "harbour", "market square", "old bridge", "railway station", "forest", "hill", "lake"]
HOUSE_ADJ = ["small", "narrow", "quiet", "yellow", "crooked", "sunny", "stone", "wooden", "tidy"]
TIMES_OF_DAY = ["morning", "evening", "afternoon", "night"]
SEASONS = ["spring", "summer", "autumn", "winter"]
HABITS = [
    "walked to the bakery for fresh bread", "read a chapter of a long novel", "watered the tomatoes",
    "fed the neighbour's cat", "wrote a few lines in a notebook", "swept the front steps",
    "listened to the radio while making tea", "went for a run along the water",
    "practised the piano for an hour", "repaired something that had broken the day before",
]
EVENTS = [
    "a letter arrived with no name on the envelope", "a storm knocked down the old oak by the road",
    "a stranger asked for directions to a street that did not exist",
    "the power went out across the whole town", "a lost dog followed {p_obj} home",
    "an old friend knocked on the door after ten years away",
    "the river rose higher than anyone could remember", "a box of photographs turned up in the attic",
    "the bakery closed without any warning", "a travelling circus set up its tents in the field",
]
REACTIONS = [
    "was surprised, but decided to find out more", "felt a little afraid at first",
    "laughed, because it seemed too strange to be true", "called a neighbour to ask for advice",
    "sat down and thought about it for a long time", "made a careful plan before doing anything",
    "told nobody about it for several days", "wrote down everything that had happened",
]
RESOLUTIONS = [
    "the whole town was talking about it", "things had quietly returned to normal",
    "{p_sub} had made two new friends", "the mystery was finally solved",
    "{p_sub} understood the town a little better", "nobody remembered how it had started",
    "{p_sub} had learned to enjoy the unexpected", "a new tradition had begun",
]
PERIODS = ["week", "month", "season", "year"]

LANDFORMS = ["valley", "meadow", "coast", "mountain path", "marsh", "orchard", "wheat field", "pine forest"]
NATURE_VERBS = ["fills", "comes alive", "is covered", "glows", "hums", "changes slowly"]
NATURE_NOUNS = [
    "wild flowers", "birdsong", "soft rain", "golden light", "fallen leaves", "fresh snow",
    "buzzing bees", "morning mist", "tall grass", "ripe apples",
]
ANIMALS = ["foxes", "deer", "swallows", "rabbits", "herons", "owls", "hedgehogs", "geese", "otters"]
ANIMAL_ACTS = [
    "search for food", "build their nests", "raise their young", "gather in large groups",
    "move to warmer places", "rest in the shade", "hunt at dusk", "hide from the cold wind",
]
WEATHER = [
    "the air is warm and still", "a cold wind blows from the north", "clouds gather over the hills",
    "the days grow longer", "the nights are clear and full of stars", "rain falls for days at a time",
]

MACHINES = [
    ("bicycle", "turning the pedals, which pull a chain that drives the rear wheel"),
    ("refrigerator", "pumping a fluid that absorbs heat inside and releases it outside"),
    ("compass", "letting a small magnet turn freely until it points along the earth's magnetic field"),
    ("windmill", "catching the wind with its sails, which turn a shaft connected to a millstone"),
    ("thermometer", "measuring how much a liquid or a metal expands as it warms"),
    ("lighthouse", "sending a strong beam of light across the water from a high tower"),
    ("water wheel", "using the weight of falling water to turn a large wheel"),
    ("sundial", "casting a shadow whose position changes as the sun moves across the sky"),
    ("telescope", "gathering light with lenses or mirrors so that distant objects look closer"),
    ("battery", "storing energy in chemicals that release electrons when a circuit is closed"),
]
CONDITIONS = [
    "the temperature drops", "the load becomes heavier", "the parts are not cleaned",
    "the weather turns damp", "it is used every day for years", "the speed increases",
]
PARTS = ["main shaft", "outer casing", "small spring", "central gear", "metal frame", "glass cover"]
EFFECTS = [
    "wears out more quickly", "needs more energy to move", "becomes less accurate",
    "makes a low humming sound", "must be adjusted by hand", "works more slowly",
]
CONSEQUENCES = [
    "engineers recommend checking it at least once a year",
    "people in earlier centuries kept spare parts at home",
    "small improvements in design made a large difference",
    "it is still taught in many schools today",
    "its basic idea has hardly changed in two hundred years",
]

DISHES = [
    ("vegetable soup", ["chop two onions and three carrots", "warm some oil in a large pot",
                        "add the vegetables and a pinch of salt", "pour in a litre of water",
                        "let it simmer for half an hour"]),
    ("apple cake", ["heat the oven", "mix flour, sugar and two eggs in a bowl",
                    "slice four apples thinly", "fold the apples into the batter",
                    "bake it for forty minutes"]),
    ("fresh bread", ["mix flour, water, yeast and salt", "knead the dough for ten minutes",
                     "leave it to rise in a warm place", "shape it into a round loaf",
                     "bake it until the crust is brown"]),
    ("tomato sauce", ["peel and chop ripe tomatoes", "fry a little garlic in olive oil",
                      "add the tomatoes and some basil", "cook it gently for twenty minutes",
                      "season it with salt and pepper"]),
    ("rice pudding", ["rinse a cup of rice", "cook it slowly in milk", "stir in sugar and vanilla",
                      "keep stirring so it does not burn", "serve it warm with cinnamon"]),
]
TIPS = [
    "It tastes even better the next day.", "Children usually enjoy helping with this one.",
    "You can freeze what is left for another week.", "Use the freshest ingredients you can find.",
    "Do not hurry the last step.", "A good friend taught me this recipe many years ago.",
]

CITIES = ["the coast", "the mountains", "the capital", "an island in the north", "a village in the south"]
TRANSPORT = ["by train", "on foot", "by bus", "by ferry", "by bicycle", "in an old car"]
SIGHTS = [
    "a cathedral with coloured windows", "a harbour full of fishing boats", "a market that sold spices",
    "a museum of old clocks", "a garden with a thousand roses", "a castle on a cliff",
    "a library older than the town itself", "a bridge made entirely of stone",
]
FEELINGS = ["tired but happy", "a little homesick", "full of new ideas", "calm and rested", "grateful"]


def _sentence_case(s: str) -> str:
    return s[0].upper() + s[1:]


class _Writer:
    """One document generator per style; `rng` is the only source of variety."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.c = rng.choice

    def story(self) -> str:
        c = self.c
        name = c(NAMES)
        sub, obj, pos = PRONOUNS[PEOPLE[name]]
        s = [
            f"{name} lived in a {c(HOUSE_ADJ)} {c(DWELLINGS)} near the {c(LANDMARKS)} of {c(TOWNS)}.",
            f"Every {c(TIMES_OF_DAY)}, {name} {c(HABITS)}.",
        ]
        if self.rng.random() < 0.6:
            s.append(f"It was a simple life, and {sub} liked it that way.")
        s.append(f"One {c(SEASONS)} {c(TIMES_OF_DAY)}, {c(EVENTS).format(p_obj=obj)}.")
        s.append(f"{_sentence_case(sub)} {c(REACTIONS)}.")
        if self.rng.random() < 0.5:
            s.append(f"{_sentence_case(pos)} friend {c(NAMES)} {c(REACTIONS)}, too.")
        s.append(f"By the end of the {c(PERIODS)}, {c(RESOLUTIONS).format(p_sub=sub)}.")
        return " ".join(s)

    def nature(self) -> str:
        c = self.c
        season = c(SEASONS)
        s = [
            f"In {season}, the {c(LANDFORMS)} {c(NATURE_VERBS)} with {c(NATURE_NOUNS)}.",
            f"{_sentence_case(c(WEATHER))}, and the {c(ANIMALS)} {c(ANIMAL_ACTS)}.",
        ]
        for _ in range(self.rng.randint(1, 3)):
            s.append(f"Near the {c(LANDMARKS)}, {c(ANIMALS)} {c(ANIMAL_ACTS)} while {c(WEATHER)}.")
        s.append(f"Those who walk there in {season} remember the {c(NATURE_NOUNS)} for a long time.")
        return " ".join(s)

    def explain(self) -> str:
        c = self.c
        device, how = c(MACHINES)
        s = [
            f"A {device} works by {how}.",
            f"When {c(CONDITIONS)}, the {c(PARTS)} {c(EFFECTS)}.",
        ]
        if self.rng.random() < 0.7:
            s.append(f"If {c(CONDITIONS)} as well, it {c(EFFECTS)}.")
        s.append(f"This is why {c(CONSEQUENCES)}.")
        s.append(f"The first {device} in {c(TOWNS)} was built more than {self.rng.randint(2, 9)} hundred years ago.")
        return " ".join(s)

    def recipe(self) -> str:
        c = self.c
        dish, steps = c(DISHES)
        words = ["First", "Then", "Next", "After that", "Finally"]
        s = [f"To make {dish}, you need only a few simple things."]
        s += [f"{w}, {step}." for w, step in zip(words, steps)]
        s.append(c(TIPS))
        return " ".join(s)

    def travel(self) -> str:
        c = self.c
        days = self.rng.randint(2, 14)
        host = c(NAMES)
        s = [
            f"Last {c(SEASONS)} I travelled to {c(CITIES)} {c(TRANSPORT)}.",
            f"The journey took {self.rng.randint(2, 11)} hours, and I spent most of it looking out of the window.",
            f"On the first day I visited {c(SIGHTS)}.",
            f"Later I found {c(SIGHTS)}, where I met {host}, who had lived there all {PRONOUNS[PEOPLE[host]][2]} life.",
            f"After {days} days I came home {c(FEELINGS)}.",
        ]
        return " ".join(s)

    def letter(self) -> str:
        c = self.c
        to, frm = c(NAMES), c(NAMES)
        s = [
            f"Dear {to},",
            f"I hope this letter finds you well in {c(TOWNS)}.",
            f"Here the {c(LANDFORMS)} {c(NATURE_VERBS)} with {c(NATURE_NOUNS)}, and {c(WEATHER)}.",
            f"Yesterday {c(TIMES_OF_DAY[:3])} {c(EVENTS).format(p_obj='me')}, and I {c(REACTIONS)}.",
            f"Please write soon and tell me how things are by the {c(LANDMARKS)}.",
            f"With warm wishes, {frm}",
        ]
        return " ".join(s)


STYLES = ("story", "nature", "explain", "recipe", "travel", "letter")


def generate_documents(seed: int = SEED, documents: int = DOCUMENTS) -> list[str]:
    rng = random.Random(seed)
    writer = _Writer(rng)
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < documents:
        paragraphs = [getattr(writer, rng.choice(STYLES))() for _ in range(rng.randint(1, 3))]
        text = "\n\n".join(paragraphs)
        if text not in seen:  # short recipes repeat now and then; a corpus should not
            seen.add(text)
            out.append(text)
    return out


def train_bpe(texts: list[str], vocab_size: int, output_dir: str) -> None:
    """Byte-level BPE (GPT-2's scheme) with <|endoftext|>, saved as gpt2-vocab.json/gpt2-merges.txt."""
    from tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer(add_prefix_space=False)
    tok.train_from_iterator(
        texts, vocab_size=vocab_size, min_frequency=2, special_tokens=[EOD], show_progress=False
    )
    tok.save_model(output_dir, "gpt2")


def main(argv: list[str] | None = None) -> int:
    default_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "data", "corpus")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output-dir", "--output_dir", dest="output_dir", default=os.path.normpath(default_dir))
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--documents", type=int, default=DOCUMENTS)
    p.add_argument("--vocab-size", "--vocab_size", dest="vocab_size", type=int, default=VOCAB_SIZE)
    args = p.parse_args(argv)
    # The tokenizers library counts pairs on several threads; a fixed count keeps merges stable.
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    os.makedirs(args.output_dir, exist_ok=True)
    texts = generate_documents(args.seed, args.documents)
    corpus = os.path.join(args.output_dir, "demo_corpus.jsonl")
    atomic_write(corpus, "".join(json.dumps({"text": text}, ensure_ascii=False) + "\n" for text in texts))
    train_bpe(texts, args.vocab_size, args.output_dir)
    for name in ("demo_corpus.jsonl", "gpt2-vocab.json", "gpt2-merges.txt"):
        path = os.path.join(args.output_dir, name)
        print(f"{path}: {os.path.getsize(path)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
