"""A RAG workload shaped like CacheBlend's (arXiv 2405.16444): long chunks, top-6 in random order, multi-hop
questions with short gold answers, planted facts to score. Written here, offline, from a seed (no download).

The corpus has workshops and people. A workshop's chunk plants who founded it; a person's chunk plants the town
they were born in. Every question needs both chunks of one pair (two hops), in one of three forms:
  "Who founded X, and in which town was that person born?"    gold "<founder>, <town>"
  "In which town was the founder of X born?"                   gold "<town>"
  "Which workshop was founded by the person born in <town>?"   gold "<workshop>"
Each chunk pads its planted facts with neutral filler (weather, trade, buildings; never a town or a person) to
about `words_per_chunk` words. A query's six chunks are its two plus four others, shuffled: the retrieval order a
plain app sends; the integrations put them in canonical order.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

TOWNS = ["Arden", "Belmora", "Corrin", "Dunhollow", "Eskar", "Fenwick", "Galloway", "Harrowgate", "Ilsmere",
         "Jorvale", "Kestrel Bay", "Lunmoor", "Marrowick", "Northam", "Oxhallow", "Pellin"]
PEOPLE = ["Ada Ashdown", "Bram Birch", "Celia Coldwell", "Dorian Drayton", "Elsa Ember", "Finn Frost",
          "Greta Greaves", "Hugo Holt", "Iris Ivers", "Jonas Jessop", "Kira Kell", "Lars Lindqvist",
          "Mira Moss", "Nils Norwood", "Opal Oakes", "Piet Pruett"]
TRADES = ["bakery", "forge", "library", "observatory", "shipyard", "weaving mill", "apothecary", "brewery",
          "clockmaker's shop", "glassworks", "tannery", "printing house", "pottery", "rope walk", "dye works",
          "bell foundry"]
FILLER = [
    "The {room} is {adj} and smells of {smell} on most mornings.",
    "In {season} the {thing} is cleaned and the floors are swept twice a day.",
    "Visitors often remark on the {adj} {thing} near the entrance.",
    "The accounts are kept in {count} thick ledgers bound in {material}.",
    "A {adj} {thing} was added to the {room} some decades ago, and it is still in use.",
    "Work starts early, and by noon the {room} is {adj} with the noise of the day.",
    "Every {season} the roof is checked for leaks and the {thing} is repainted.",
    "The apprentices learn to handle the {thing} before they may touch anything else.",
    "Its {material} shelves hold {count} boxes of tools, samples and old letters.",
    "On rainy days the {room} grows {adj}, and the lamps are lit well before evening.",
]
WORDS = {
    "room": ["workroom", "front hall", "back yard", "storeroom", "upper floor", "cellar"],
    "adj": ["quiet", "busy", "narrow", "bright", "crowded", "cold", "warm", "tidy"],
    "smell": ["pine resin", "wet stone", "smoke", "fresh bread", "linseed oil", "old paper"],
    "season": ["spring", "summer", "autumn", "winter"],
    "thing": ["great oak table", "iron stove", "tall window", "copper kettle", "long workbench", "brass scale"],
    "count": ["three", "five", "seven", "eleven", "twelve", "twenty"],
    "material": ["leather", "oak", "pine", "canvas", "walnut", "birch"],
}


@dataclass
class PaperWorkload:
    chunks: list[str]
    questions: list[str]
    answers: list[tuple[str, ...]]  # the planted facts each question asks for
    gold: list[str]  # each question's gold answer, a few words (scored by token F1: rag_fidelity.f1_score)
    retrieved: list[list[int]]  # six chunk indices per question, in (random) retrieval order


def _filler(rng: random.Random, words: int) -> str:
    out: list[str] = []
    while sum(len(s.split()) for s in out) < words:
        out.append(rng.choice(FILLER).format(**{k: rng.choice(v) for k, v in WORDS.items()}))
    return " ".join(out)


def make_paper_workload(num_queries: int, num_entities: int = 12, top_k: int = 6, seed: int = 0,
                        words_per_chunk: int = 300) -> PaperWorkload:
    rng = random.Random(seed)
    people = rng.sample(PEOPLE, num_entities)
    towns = rng.sample(TOWNS, num_entities)  # person i was born in towns[i]
    founders = rng.sample(range(num_entities), num_entities)  # workshop j was founded by people[founders[j]]
    workshops = [f"the {trade} on {rng.choice(['Mill', 'Bridge', 'Chapel', 'Harbour'])} Lane"
                 for trade in rng.sample(TRADES, num_entities)]
    chunks = []
    for j, shop in enumerate(workshops):  # chunk j: a workshop and its founder
        half = words_per_chunk // 2
        chunks.append(f"{shop[0].upper()}{shop[1:]} is an old workshop. {_filler(rng, half)} "
                      f"{shop[0].upper()}{shop[1:]} was founded by {people[founders[j]]}. {_filler(rng, half)}")
    for i, person in enumerate(people):  # chunk num_entities + i: a person and their birthplace
        half = words_per_chunk // 2
        chunks.append(f"This is the story of {person}. {_filler(rng, half)} "
                      f"{person} was born in the town of {towns[i]}. {_filler(rng, half)}")
    questions, answers, gold, retrieved = [], [], [], []
    for _ in range(num_queries):
        j = rng.randrange(num_entities)
        founder, town = people[founders[j]], towns[founders[j]]
        form = rng.randrange(3)
        if form == 0:
            questions.append(f"Who founded {workshops[j]}, and in which town was that person born?")
            answers.append((founder, town))
            gold.append(f"{founder}, {town}")
        elif form == 1:
            questions.append(f"In which town was the founder of {workshops[j]} born?")
            answers.append((town,))
            gold.append(town)
        else:
            questions.append(f"Which workshop was founded by the person born in the town of {town}?")
            answers.append((workshops[j].removeprefix("the "),))
            gold.append(workshops[j])
        needed = [j, num_entities + founders[j]]
        others = rng.sample([c for c in range(len(chunks)) if c not in needed], top_k - 2)
        order = needed + others
        rng.shuffle(order)
        retrieved.append(order)
    return PaperWorkload(chunks, questions, answers, gold, retrieved)
