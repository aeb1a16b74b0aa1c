"""A reproducible RAG workload: a synthetic corpus of fact chunks, BM25 retrieval, Zipf-popular queries.

Each entity has two chunks (an overview and details); entities share towns and trades, so a
query's top-4 holds its entity's chunks plus neighbours that vary with the question. Queries
pick entities with Zipf-like popularity, so popular chunks recur next to different neighbours
and in different retrieval orders: the case where plain prefix caching misses.
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from dataclasses import dataclass

TOWNS = ["Arden", "Belmora", "Corrin", "Dunhollow", "Eskar", "Fenwick", "Galloway", "Harrowgate", "Ilsmere",
         "Jorvale", "Kestrel Bay", "Lunmoor"]
TRADES = ["bakery", "forge", "library", "observatory", "shipyard", "weaving mill", "apothecary", "brewery",
          "clockmaker's shop", "glassworks"]
FIRST = ["Ada", "Bram", "Celia", "Dorian", "Elsa", "Finn", "Greta", "Hugo", "Iris", "Jonas", "Kira", "Lars",
         "Mira", "Nils", "Opal", "Piet", "Quinn", "Rosa", "Sven", "Tilda"]
LAST = ["Ashdown", "Birch", "Coldwell", "Drayton", "Ember", "Frost", "Greaves", "Holt", "Ivers", "Jessop"]
GOODS = ["copper lanterns", "rye bread", "star charts", "linen sails", "herbal tonics", "amber ale",
         "pocket watches", "blue glass bottles", "rare maps", "iron hinges"]
QUESTIONS = ["Who founded {name}?", "When was {name} founded?", "What is {name} known for?",
             "How many people work at {name}?", "What does {name} sell?", "Where is {name}?"]


@dataclass
class Workload:
    chunks: list[str]
    queries: list[str]
    retrieved: list[list[int]]  # top-k chunk indices per query, in retrieval (score) order


def make_corpus(num_entities: int, rng: random.Random) -> tuple[list[str], list[str]]:
    names, chunks = [], []
    for i in range(num_entities):
        town, trade = TOWNS[i % len(TOWNS)], TRADES[(i * 7) % len(TRADES)]
        name = f"the {rng.choice(['Old', 'Grand', 'Little', 'North', 'Silver', 'Golden'])} {trade} of {town} No. {i}"
        founder = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
        year, staff, good = rng.randint(1650, 1950), rng.randint(3, 90), rng.choice(GOODS)
        names.append(name)
        chunks.append(f"{name[0].upper() + name[1:]} stands near the market square of {town}. It was founded in {year} by "
                      f"{founder}, who had trained in {rng.choice(TOWNS)}. Today {staff} people work there, and "
                      f"travellers come to {town} mainly for its {good}.")
        chunks.append(f"More about {name}: its {good} are sold every {rng.choice(['Monday', 'Friday', 'Sunday'])} "
                      f"and shipped to {rng.choice(TOWNS)}. The building was rebuilt in {year + rng.randint(20, 60)} "
                      f"after a {rng.choice(['fire', 'flood', 'storm'])}, and {founder.split()[0]}'s "
                      f"descendants still keep its ledgers.")
    return names, chunks


class BM25:
    def __init__(self, docs: list[str], k1: float = 1.2, b: float = 0.75):
        self.docs = [Counter(_words(d)) for d in docs]
        self.avg = sum(sum(d.values()) for d in self.docs) / len(self.docs)
        df = Counter(w for d in self.docs for w in d)
        self.idf = {w: math.log(1 + (len(docs) - n + 0.5) / (n + 0.5)) for w, n in df.items()}
        self.k1, self.b = k1, b

    def top(self, query: str, k: int) -> list[int]:
        words = _words(query)
        scores = []
        for i, doc in enumerate(self.docs):
            length = sum(doc.values())
            score = sum(self.idf.get(w, 0.0) * doc[w] * (self.k1 + 1)
                        / (doc[w] + self.k1 * (1 - self.b + self.b * length / self.avg)) for w in words if w in doc)
            scores.append((score, i))
        return [i for _, i in sorted(scores, reverse=True)[:k]]


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def make_workload(num_chunks: int = 240, num_queries: int = 200, top_k: int = 4, zipf_s: float = 1.1,
                  seed: int = 0) -> Workload:
    rng = random.Random(seed)
    names, chunks = make_corpus(num_chunks // 2, rng)
    weights = [1 / (rank + 1) ** zipf_s for rank in range(len(names))]
    popularity = rng.sample(range(len(names)), len(names))  # which entity is the most popular, etc.
    index = BM25(chunks)
    queries, retrieved = [], []
    for _ in range(num_queries):
        entity = popularity[rng.choices(range(len(names)), weights)[0]]
        query = rng.choice(QUESTIONS).format(name=names[entity])
        queries.append(query)
        retrieved.append(index.top(query, top_k))
    return Workload(chunks, queries, retrieved)
