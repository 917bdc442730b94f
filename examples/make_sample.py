"""Writes examples/sample.parquet: a small retrieval log written by the ctxprec team (not taken
from any dataset), in the default column layout: id, query, expected_output, contexts, plus a
`retriever` column and human `labels` for the agreement report.

    python examples/make_sample.py
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

# (id, retriever, query, expected output, [(context item, human label), ...])
ROWS: list[tuple[str, str, str, str | None, list[tuple[str, bool]]]] = [
    (
        "q001",
        "bm25",
        "What temperature does water boil at on Mount Everest's summit?",
        "About 70 degrees Celsius, because air pressure at the summit is roughly a third of sea level.",
        [
            (
                "Water boils at a lower temperature when air pressure drops; at the summit of Mount Everest, "
                "where pressure is about a third of sea level, it boils at roughly 70 degrees Celsius.",
                True,
            ),
            (
                "Mount Everest was first climbed in 1953 by Edmund Hillary and Tenzing Norgay.",
                False,
            ),
            (
                "Air pressure on the summit of Everest is around 33 kilopascals, about a third of the "
                "101 kilopascals measured at sea level.",
                True,
            ),
            (
                "Pressure cookers raise the boiling point of water to about 120 degrees Celsius.",
                False,
            ),
        ],
    ),
    (
        "q002",
        "bm25",
        "Who wrote the novel Frankenstein and when was it first published?",
        "Mary Shelley wrote Frankenstein; it was first published anonymously in London in 1818.",
        [
            ("Frankenstein; or, The Modern Prometheus is a novel by Mary Shelley.", True),
            ("Bram Stoker's Dracula appeared in 1897 and shaped the vampire genre.", False),
            (
                "The first edition of Frankenstein was published anonymously in London on 1 January 1818.",
                True,
            ),
        ],
    ),
    (
        "q003",
        "dense",
        "How many bones does an adult human skeleton have?",
        "An adult human skeleton has 206 bones.",
        [
            ("Babies are born with around 270 bones, many of which fuse during growth.", False),
            ("The femur is the longest bone in the human body.", False),
            ("By adulthood the human skeleton consists of 206 bones.", True),
        ],
    ),
    (
        "q004",
        "dense",
        "What is the capital of Australia?",
        "Canberra is the capital of Australia.",
        [
            (
                "Canberra was selected as the capital of Australia in 1908 as a compromise between Sydney "
                "and Melbourne.",
                True,
            ),
            ("Sydney is the largest city in Australia and home to the Opera House.", False),
        ],
    ),
    (
        "q005",
        "bm25",
        "Why is the sky blue during the day?",
        "Sunlight is scattered by air molecules, and shorter blue wavelengths scatter far more "
        "(Rayleigh scattering), so blue light reaches our eyes from all directions.",
        [
            ("Sunsets look red because light crosses more atmosphere near the horizon.", False),
            ("The Moon has no atmosphere, so its sky looks black even in daylight.", False),
            (
                "Rayleigh scattering by air molecules is much stronger for short wavelengths, which is why "
                "blue light is scattered across the whole sky.",
                True,
            ),
            ("Sunlight contains all visible wavelengths, from red to violet.", True),
        ],
    ),
    (
        "q006",
        "dense",
        "Which planet in our solar system has the most moons?",
        "Saturn has the most confirmed moons, with more than 140.",
        [
            (
                "Saturn has 146 confirmed moons, more than any other planet in the solar system.",
                True,
            ),
            ("Jupiter's moon Ganymede is the largest moon in the solar system.", False),
            ("Saturn's rings are made mostly of water ice.", False),
        ],
    ),
    (
        "q007",
        "bm25",
        "What does the HTTP status code 429 mean?",
        "429 Too Many Requests: the client sent too many requests in a given time; the server may "
        "send a Retry-After header saying how long to wait.",
        [
            ("HTTP 404 Not Found means the server cannot find the requested resource.", False),
            (
                "HTTP 503 Service Unavailable signals that the server is temporarily overloaded.",
                False,
            ),
            (
                "The 429 Too Many Requests status code indicates the user has sent too many requests in a "
                "given amount of time.",
                True,
            ),
            (
                "A 429 response may include a Retry-After header indicating how long to wait before "
                "making a new request.",
                True,
            ),
        ],
    ),
    (
        "q008",
        "dense",
        "When did the Berlin Wall fall?",
        "The Berlin Wall fell on 9 November 1989.",
        [],
    ),
    (
        "q009",
        "dense",
        "What gas do plants absorb for photosynthesis?",
        "Plants absorb carbon dioxide from the air and use light to turn it into sugars, "
        "releasing oxygen.",
        [
            (
                "Photosynthesis converts carbon dioxide and water into glucose and oxygen using light "
                "energy.",
                True,
            ),
            ("Chlorophyll gives leaves their green colour.", False),
            ("Stomata on the leaf surface let carbon dioxide in and oxygen out.", True),
        ],
    ),
    (
        "q010",
        "bm25",
        "Who painted the ceiling of the Sistine Chapel?",
        None,
        [
            ("The Sistine Chapel is in Vatican City.", False),
            ("Michelangelo painted the Sistine Chapel ceiling between 1508 and 1512.", True),
            ("Leonardo da Vinci painted the Last Supper in Milan.", False),
        ],
    ),
    (
        "q011",
        "dense",
        "What is the speed of light in a vacuum?",
        "Light travels at 299,792,458 metres per second in a vacuum.",
        [
            ("Sound travels at about 343 metres per second in air at 20 degrees Celsius.", False),
            (
                "The speed of light in vacuum is exactly 299,792,458 metres per second, by definition of "
                "the metre.",
                True,
            ),
        ],
    ),
    (
        "q012",
        "bm25",
        "How long does it take the Earth to orbit the Sun?",
        "About 365.25 days, which is why a leap day is added every four years.",
        [
            ("A sidereal year, one orbit of the Sun, lasts about 365.256 days.", True),
            (
                "A leap day is added every four years to keep the calendar aligned with Earth's orbit.",
                True,
            ),
            ("The Moon orbits the Earth roughly every 27.3 days.", False),
        ],
    ),
]


def build_table() -> pa.Table:
    return pa.table(
        {
            "id": [r[0] for r in ROWS],
            "retriever": [r[1] for r in ROWS],
            "query": [r[2] for r in ROWS],
            "expected_output": [r[3] for r in ROWS],
            "contexts": [[c for c, _ in r[4]] for r in ROWS],
            "labels": [[lab for _, lab in r[4]] for r in ROWS],
        },
        schema=pa.schema(
            [
                ("id", pa.string()),
                ("retriever", pa.string()),
                ("query", pa.string()),
                ("expected_output", pa.string()),
                ("contexts", pa.list_(pa.string())),
                ("labels", pa.list_(pa.bool_())),
            ]
        ),
    )


if __name__ == "__main__":
    # the one copy is the package's (`ctxprec sample`); examples/sample.parquet links to it
    out = Path(__file__).resolve().parents[1] / "pipeline" / "data" / "sample.parquet"
    pq.write_table(build_table(), out)
    print(f"wrote {out} ({len(ROWS)} rows)")
