"""SYNTHETIC multi-hop QA data: a small invented world, its wiki-18 style corpus and its questions.

Everything here is made up (invented names of people, cities, countries, universities,
companies and films); nothing describes the real world. It exists so that retrieval and
the QA environment run offline, at a realistic size, on questions that *need* two
retrieval hops. Generation is deterministic in ``(seed, scale)`` and takes about a
second at ``scale=1`` (20,940 passages), so the corpus is regenerated, never committed.

The world (counts at ``scale=1``; every count scales, with small minimums):

==============  =====  =========================================================
entity          count  passages (title = the entity's name)
==============  =====  =========================================================
country            80  2: official name, region, capital; economy (industries)
city            1,500  2: country, river, founding year; culture (a twin city
                       *and its country*, a distractor)
person          6,000  2: birth year, profession, birth city; studies (university)
                       and a colleague (a distractor person)
university        400  1: city, founding year
company         2,500  1: industry, founding year, founder, headquarters city
film            2,500  1: year, genre, director, a lead actor
event             380  1: a festival in a city naming several people (distractor)
==============  =====  =========================================================

Question types (each needs the two gold passages listed; the question names only the
first hop's entity, so the second passage can only be found through the first):

====================  ===============================================  ============================
type                  question                                         gold passages (hop 1, hop 2)
====================  ===============================================  ============================
birth_country         In which country was P born?                     P bio, birth city
director_birthplace   In which city was the director of F born?        F, director bio
director_birth_year   In what year was the director of F born?         F, director bio
founder_university    Which university did the founder of C attend?    C, founder studies
company_country       In which country is C headquartered?             C, HQ city
university_city       In which city is the university P attended?      P studies, university
founded_first         Which company was founded first, A or B?         A, B (comparison)
same_director         Were F and G directed by the same person?        F, G (yes/no)
====================  ===============================================  ============================

A separate set of *single-hop* questions (``birthplace``: "In which city
was P born?", ``director``: "Who directed F?", ``headquarters``: "In which city is C
headquartered?"; one gold passage each) serves as an easy warm-up mix for tiny models;
it is drawn with its own RNG, so adding it changed neither the corpus nor the two-hop set.

Each question carries FlashRAG fields (``question``, ``golden_answers`` with aliases,
e.g. a country's official name) plus ``metadata``: ``type``, ``gold_ids`` and
``hop_queries`` (the natural query for each hop once the previous hop is known), used
to report recall of each hop.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from retrieval_index.protocol import make_contents

#: Marked on every question and in every file name this module writes.
LABEL = "synthetic"
#: Bumped whenever generation changes, so cached corpora and indexes of an older world are not reused.
GENERATOR_VERSION = 2

BASE_COUNTS = {"country": 80, "city": 1500, "person": 6000, "university": 400, "company": 2500, "film": 2500,
               "event": 380}
MIN_COUNTS = {"country": 4, "city": 12, "person": 40, "university": 4, "company": 12, "film": 12, "event": 4}
SINGLE_HOP_TYPES = ("birthplace", "director", "headquarters")
QUESTION_TYPES = ("birth_country", "director_birthplace", "director_birth_year", "founder_university",
                  "company_country", "university_city", "founded_first", "same_director")

_ONSETS = ("b", "br", "c", "d", "dr", "f", "g", "gr", "h", "k", "kr", "l", "m", "n", "p", "r", "s", "st", "t",
           "tr", "v", "z", "th", "sh", "w", "j")
_VOWELS = ("a", "e", "i", "o", "u", "ae", "ia", "ou", "ei", "y")
_CODAS = ("", "", "", "", "n", "r", "l", "s", "th", "m", "nd", "rk")
_REGIONS = ("the Amber Coast", "the Northern Reach", "the Ashen Plateau", "the Glass Archipelago",
            "the Verdant Basin", "the Cinder Steppe", "the Pale Fjords", "the Saffron Delta")
_STATE_FORMS = ("Republic", "Kingdom", "Federation", "Commonwealth", "Principality", "Union")
_PROFESSIONS = ("painter", "composer", "novelist", "architect", "chemist", "economist", "sculptor", "poet",
                "historian", "engineer", "physician", "photographer")
_FIELDS = ("mathematics", "law", "medicine", "philosophy", "engineering", "music", "botany", "astronomy",
           "linguistics", "economics")
_INDUSTRIES = ("shipping", "textile", "software", "mining", "brewing", "aerospace", "pharmaceutical", "publishing",
               "glassmaking", "railway")
_COMPANY_SUFFIX = ("Works", "Dynamics", "Holdings", "Industries", "Company", "Group", "Foundry", "Labs")
_UNIVERSITY_FORMS = ("{w} University", "{w} Institute of Technology", "{w} College", "University of {w}",
                     "{w} Polytechnic")
_GENRES = ("drama", "comedy", "thriller", "documentary", "musical", "western", "science fiction", "romance")
_ADJ = ("Silent", "Crimson", "Last", "Hollow", "Golden", "Broken", "Distant", "Winter", "Iron", "Quiet", "Lost",
        "Burning", "Endless", "Hidden", "Paper")
_NOUN = ("Harbor", "Orchard", "Lantern", "Meridian", "Tide", "Citadel", "Garden", "Signal", "Mirror", "Bridge",
         "Compass", "Archive", "Horizon", "Furnace", "Voyage")
_FESTIVALS = ("Lantern Festival", "Book Fair", "Film Week", "Music Days", "Harvest Fair", "Science Forum")
_RIVER = ("river", "River")


@dataclass
class World:
    """The generated world: entity records, the passages, and the questions."""

    seed: int
    scale: float
    passages: list[tuple[str, str]] = field(default_factory=list)  # (id, contents)
    questions: list[dict[str, Any]] = field(default_factory=list)  # two-hop
    single_hop_questions: list[dict[str, Any]] = field(default_factory=list)
    entities: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return world_name(self.seed, self.scale)


def world_name(seed: int, scale: float) -> str:
    """``synthetic_world_v<GENERATOR_VERSION>_seed<seed>_scale<scale>``: names files and cache folders."""
    return f"{LABEL}_world_v{GENERATOR_VERSION}_seed{seed}_scale{scale:g}"


class _Names:
    """Unique invented names (a shared pool, so no two entities share a title)."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()

    def word(self, syllables: tuple[int, int] = (2, 2)) -> str:
        n = self.rng.randint(*syllables)
        parts = [self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) + self.rng.choice(_CODAS) for _ in range(n)]
        return "".join(parts).capitalize()

    def unique(self, make) -> str:
        for _ in range(10_000):
            name = make()
            if name not in self.used and name.lower() not in ("yes", "no"):
                self.used.add(name)
                return name
        raise RuntimeError("ran out of unique names; the syllable inventory is too small for this scale")


def generate_world(seed: int = 0, scale: float = 1.0, questions_per_type: int | None = None) -> World:
    """Generate the world for ``(seed, scale)`` (deterministic).

    Args:
        seed: the world's seed.
        scale: multiplies every entity count (:data:`BASE_COUNTS`, floored at
            :data:`MIN_COUNTS`); ``scale=1`` gives 20,940 passages.
        questions_per_type: questions of each type (default ``max(4, 250 * scale)``).
    """
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale!r}")
    rng = random.Random(f"{LABEL}-{seed}")
    names = _Names(rng)
    n = {k: max(MIN_COUNTS[k], int(round(v * scale))) for k, v in BASE_COUNTS.items()}
    world = World(seed, scale)

    countries = [{"name": names.unique(names.word), "form": rng.choice(_STATE_FORMS), "region": rng.choice(_REGIONS),
                  "founded": rng.randint(1600, 1950)} for _ in range(n["country"])]
    cities = [{"name": names.unique(names.word), "country": rng.randrange(n["country"]),
               "river": names.unique(lambda: names.word((2, 2))), "founded": rng.randint(900, 1900),
               "population": rng.randint(20, 3000) * 1000} for _ in range(n["city"])]
    for c, country in enumerate(countries):  # every country has a capital among its cities
        own = [i for i, city in enumerate(cities) if city["country"] == c]
        if not own:
            i = rng.randrange(n["city"])
            cities[i]["country"] = c
            own = [i]
        country["capital"] = rng.choice(own)
    universities = [{"name": names.unique(lambda: rng.choice(_UNIVERSITY_FORMS).format(w=names.word())),
                     "city": rng.randrange(n["city"]), "founded": rng.randint(1500, 1990)}
                    for _ in range(n["university"])]
    first_names = [names.word((2, 2)) for _ in range(max(20, n["person"] // 15))]
    people = [{"name": names.unique(lambda: f"{rng.choice(first_names)} {names.word()}"),
               "born": rng.randint(1900, 1995), "city": rng.randrange(n["city"]),
               "profession": rng.choice(_PROFESSIONS), "field": rng.choice(_FIELDS),
               "university": rng.randrange(n["university"]), "colleague": rng.randrange(n["person"])}
              for _ in range(n["person"])]
    companies = [{"name": names.unique(lambda: f"{names.word()} {rng.choice(_COMPANY_SUFFIX)}"),
                  "industry": rng.choice(_INDUSTRIES), "founded": rng.randint(1850, 2015),
                  "founder": rng.randrange(n["person"]), "city": rng.randrange(n["city"])}
                 for _ in range(n["company"])]
    directors = rng.sample(range(n["person"]), max(4, n["film"] // 3))  # directors make ~3 films each
    films = []
    for _ in range(n["film"]):
        director = rng.choice(directors)
        # released when the director was at least 18, so the release year never equals the birth year
        year = rng.randint(max(1950, people[director]["born"] + 18), 2020)
        films.append({"name": names.unique(lambda: f"The {rng.choice(_ADJ)} {rng.choice(_NOUN)} of {names.word()}"),
                      "year": year, "genre": rng.choice(_GENRES), "director": director,
                      "actor": rng.randrange(n["person"])})
    for p, person in enumerate(people):
        if person["colleague"] == p:
            person["colleague"] = (p + 1) % n["person"]
    events = [{"city": rng.randrange(n["city"]), "festival": rng.choice(_FESTIVALS), "year": rng.randint(1960, 2020),
               "guests": rng.sample(range(n["person"]), 3)} for _ in range(n["event"])]
    world.entities = {"country": countries, "city": cities, "person": people, "university": universities,
                      "company": companies, "film": films, "event": events}
    _write_passages(world, rng)
    per_type = questions_per_type or max(4, int(round(250 * scale)))
    _make_questions(world, rng, per_type)
    _make_single_hop(world, random.Random(f"{LABEL}-{seed}-single-hop"), per_type)
    return world


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _write_passages(world: World, rng: random.Random) -> None:
    e = world.entities
    countries, cities, people = e["country"], e["city"], e["person"]
    out = world.passages

    def add(record: dict, key: str, title: str, text: str) -> None:
        pid = str(len(out))
        record.setdefault("passages", {})[key] = pid
        out.append((pid, make_contents(title, text)))

    by_country: dict[int, list[int]] = {}
    for i, company in enumerate(e["company"]):
        by_country.setdefault(cities[company["city"]]["country"], []).append(i)
    articles = [(kind, i) for kind in ("country", "city", "person", "university", "company", "film", "event")
                for i in range(len(e[kind]))]
    rng.shuffle(articles)  # articles in random order, sections of one article together (as in wiki-18)
    for kind, i in articles:
        r = e[kind][i]
        if kind == "country":
            add(r, "intro", r["name"], f"{r['name']}, officially the {r['form']} of {r['name']}, is a country in "
                f"{r['region']}. Its capital is {cities[r['capital']]['name']}. It became independent in {r['founded']}.")
            industries = sorted({e["company"][j]["industry"] for j in by_country.get(i, [])})[:3] or ["farming"]
            add(r, "economy", r["name"], f"The economy of {r['name']} rests on trade along its rivers. Its main "
                f"industries are {', '.join(industries)}.")
        elif kind == "city":
            add(r, "intro", r["name"], f"{r['name']} is a city in {countries[r['country']]['name']}, on the "
                f"{r['river']} {_RIVER[1]}. It was founded in {r['founded']} and has about {r['population']:,} inhabitants.")
            twin = cities[(i * 7 + 3) % len(cities)]
            add(r, "culture", r["name"], f"{r['name']} is known for its markets and old bridges. It is twinned "
                f"with {twin['name']}, a city in {countries[twin['country']]['name']}.")
        elif kind == "person":
            add(r, "bio", r["name"], f"{r['name']} (born {r['born']}) is {_article(r['profession'])} {r['profession']}. {r['name']} was born "
                f"in {cities[r['city']]['name']} and began working there at a young age.")
            surname = r["name"].split(" ", 1)[1]
            add(r, "studies", r["name"], f"{r['name']} studied {r['field']} at {e['university'][r['university']]['name']}. "
                f"Later, {surname} collaborated with {people[r['colleague']]['name']} on several projects.")
        elif kind == "university":
            add(r, "intro", r["name"], f"{r['name']} is a public university in {cities[r['city']]['name']}. "
                f"It was founded in {r['founded']}.")
        elif kind == "company":
            add(r, "intro", r["name"], f"{r['name']} is {_article(r['industry'])} {r['industry']} company founded in {r['founded']} by "
                f"{people[r['founder']]['name']}. Its headquarters are in {cities[r['city']]['name']}.")
        elif kind == "film":
            add(r, "intro", r["name"], f"{r['name']} is a {r['year']} {r['genre']} film directed by "
                f"{people[r['director']]['name']}. It stars {people[r['actor']]['name']}.")
        else:
            city = cities[r["city"]]["name"]
            title = f"{r['year']} {city} {r['festival']}"
            guests = ", ".join(people[g]["name"] for g in r["guests"])
            add(r, "intro", title, f"The {title} took place in {city} in {r['year']}. Guests included {guests}.")


def _make_questions(world: World, rng: random.Random, per_type: int) -> None:
    """The two-hop questions: ``per_type`` of each type, bridge types first, then the
    comparisons (one ``rng`` in a fixed order, so one seed gives one question set)."""
    qs: list[dict[str, Any]] = []
    numbers: dict[str, int] = {}

    def add(qtype: str, question: str, answers: list[str], gold: list[str], hops: list[str], **extra: Any) -> None:
        numbers[qtype] = numbers.get(qtype, -1) + 1
        qs.append({"id": f"{LABEL}/{qtype}/{numbers[qtype]}",
                   "question": question, "golden_answers": answers,
                   "metadata": {"type": qtype, "gold_ids": gold, "hop_queries": hops, LABEL: True, **extra}})

    _bridge_questions(world.entities, rng, per_type, add)
    _comparison_questions(world.entities, rng, per_type, add)
    world.questions = qs


def _country_answers(c: dict) -> list[str]:
    return [c["name"], f"{c['form']} of {c['name']}"]


def _pick(rng: random.Random, seq: list, k: int) -> list[int]:
    return rng.sample(range(len(seq)), min(k, len(seq)))


def _bridge_questions(e: dict[str, list[dict]], rng: random.Random, per_type: int, add: Any) -> None:
    """Questions whose answer lies one passage past a bridge entity, given to ``add``."""
    countries, cities, people, unis = e["country"], e["city"], e["person"], e["university"]
    companies, films = e["company"], e["film"]
    for i in _pick(rng, people, per_type):
        p = people[i]
        city = cities[p["city"]]
        add("birth_country", f"In which country was {p['name']} born?", _country_answers(countries[city["country"]]),
            [p["passages"]["bio"], city["passages"]["intro"]],
            [f"In which country was {p['name']} born?", f"In which country is {city['name']}?"], bridge=city["name"])
    for qtype in ("director_birthplace", "director_birth_year"):
        for i in _pick(rng, films, per_type):
            f = films[i]
            d = people[f["director"]]
            if qtype == "director_birthplace":
                q, ans, hop2 = (f"In which city was the director of {f['name']} born?", [cities[d["city"]]["name"]],
                                f"Where was {d['name']} born?")
            else:
                q, ans, hop2 = (f"In what year was the director of {f['name']} born?", [str(d["born"])],
                                f"When was {d['name']} born?")
            add(qtype, q, ans, [f["passages"]["intro"], d["passages"]["bio"]], [q, hop2], bridge=d["name"])
    for i in _pick(rng, companies, per_type):
        c = companies[i]
        founder = people[c["founder"]]
        q = f"Which university did the founder of {c['name']} attend?"
        add("founder_university", q, [unis[founder["university"]]["name"]],
            [c["passages"]["intro"], founder["passages"]["studies"]],
            [q, f"Which university did {founder['name']} attend?"], bridge=founder["name"])
    for i in _pick(rng, companies, per_type):
        c = companies[i]
        city = cities[c["city"]]
        q = f"In which country is {c['name']} headquartered?"
        add("company_country", q, _country_answers(countries[city["country"]]),
            [c["passages"]["intro"], city["passages"]["intro"]], [q, f"In which country is {city['name']}?"],
            bridge=city["name"])
    for i in _pick(rng, people, per_type):
        p = people[i]
        u = unis[p["university"]]
        q = f"In which city is the university that {p['name']} attended?"
        add("university_city", q, [cities[u["city"]]["name"]], [p["passages"]["studies"], u["passages"]["intro"]],
            [q, f"Where is {u['name']} located?"], bridge=u["name"])


def _comparison_questions(e: dict[str, list[dict]], rng: random.Random, per_type: int, add: Any) -> None:
    """Questions that compare two entities (founded first, same director), given to ``add``."""
    companies, films = e["company"], e["film"]
    made = 0
    while made < per_type:
        a, b = rng.sample(range(len(companies)), 2)
        ca, cb = companies[a], companies[b]
        if ca["founded"] == cb["founded"]:
            continue
        first = ca if ca["founded"] < cb["founded"] else cb
        add("founded_first", f"Which company was founded first, {ca['name']} or {cb['name']}?", [first["name"]],
            [ca["passages"]["intro"], cb["passages"]["intro"]],
            [f"When was {ca['name']} founded?", f"When was {cb['name']} founded?"])
        made += 1
    by_director: dict[int, list[int]] = {}
    for i, f in enumerate(films):
        by_director.setdefault(f["director"], []).append(i)
    shared = [v for v in by_director.values() if len(v) >= 2]
    for k in range(per_type):
        if k % 2 == 0 and shared:
            a, b = rng.sample(rng.choice(shared), 2)
        else:
            a, b = rng.sample(range(len(films)), 2)
        fa, fb = films[a], films[b]
        add("same_director", f"Were {fa['name']} and {fb['name']} directed by the same person?",
            ["yes" if fa["director"] == fb["director"] else "no"], [fa["passages"]["intro"], fb["passages"]["intro"]],
            [f"Who directed {fa['name']}?", f"Who directed {fb['name']}?"])


def _make_single_hop(world: World, rng: random.Random, per_type: int) -> None:
    e = world.entities
    cities, people, companies, films = e["city"], e["person"], e["company"], e["film"]
    qs = world.single_hop_questions

    def add(qtype: str, k: int, question: str, answers: list[str], gold: str) -> None:
        qs.append({"id": f"{LABEL}/{qtype}/{k}", "question": question, "golden_answers": answers,
                   "metadata": {"type": qtype, "gold_ids": [gold], "hop_queries": [question], LABEL: True}})

    for k, i in enumerate(rng.sample(range(len(people)), min(per_type, len(people)))):
        p = people[i]
        add("birthplace", k, f"In which city was {p['name']} born?", [cities[p["city"]]["name"]], p["passages"]["bio"])
    for k, i in enumerate(rng.sample(range(len(films)), min(per_type, len(films)))):
        f = films[i]
        director = people[f["director"]]["name"]
        add("director", k, f"Who directed {f['name']}?", [director, director.split(" ", 1)[1]], f["passages"]["intro"])
    for k, i in enumerate(rng.sample(range(len(companies)), min(per_type, len(companies)))):
        c = companies[i]
        add("headquarters", k, f"In which city is {c['name']} headquartered?", [cities[c["city"]]["name"]],
            c["passages"]["intro"])


def write_world(out_dir: str | os.PathLike, seed: int = 0, scale: float = 1.0) -> tuple[Path, Path]:
    """Write ``<name>.jsonl`` (the corpus), ``<name>.questions.jsonl`` (two-hop) and
    ``<name>.single_hop.jsonl`` into ``out_dir``; returns the first two paths.

    Idempotent: files already there (same seed and scale) are kept.
    """
    from retrieval_index.corpus import write_jsonl

    out = Path(out_dir)
    name = world_name(seed, scale)
    corpus, questions, single = (out / f"{name}.jsonl", out / f"{name}.questions.jsonl",
                                 out / f"{name}.single_hop.jsonl")
    if corpus.exists() and questions.exists() and single.exists():
        return corpus, questions
    world = generate_world(seed, scale)
    if not corpus.exists():
        write_jsonl(corpus, world.passages)
    for path, rows in ((questions, world.questions), (single, world.single_hop_questions)):
        if not path.exists():
            tmp = path.with_name(path.name + ".tmp")
            with open(tmp, "w", encoding="utf-8") as f:
                for q in rows:
                    f.write(json.dumps(q) + "\n")
            os.replace(tmp, path)
    return corpus, questions


def single_hop_path(questions_path: str | os.PathLike) -> Path:
    """The single-hop question file written beside ``<name>.questions.jsonl``."""
    path = Path(questions_path)
    return path.with_name(path.name.replace(".questions.jsonl", ".single_hop.jsonl"))


def read_questions(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The questions written by :func:`write_world`."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
