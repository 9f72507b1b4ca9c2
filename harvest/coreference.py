"""A model-free coreference corpus: facts that only a reader of both spans can keep.

Each case is two spans of one conversation: the first names someone, the second states a
fact about them by pronoun only, and the words that fact must keep. Extracting span by
span, the second span's fact has no subject; extracting the batch as a whole, it does.
Used by the tests (with :func:`loomrt.harvest.scripted.coreference_extractor`) and by
``loomrt bench harvest`` (with the embedded model).
"""

from __future__ import annotations

__all__ = ["CASES"]

CASES: list[tuple[str, str, tuple[str, ...]]] = [
    (
        "Yesterday I had lunch with my old friend Teodora from university.",
        "She just got a job as a marine biologist in Halifax.",
        ("Teodora", "biologist"),
    ),
    (
        "My manager is called Obinna, he joined the company in spring.",
        "He insists that every pull request gets two reviews.",
        ("Obinna", "review"),
    ),
    (
        "I finally met my neighbour Ruairi at the bus stop this morning.",
        "He restores vintage motorcycles in his garage.",
        ("Ruairi", "motorcycle"),
    ),
    (
        "We hired a new designer, Anneliese, to redo the website.",
        "She prefers to present mockups on Fridays.",
        ("Anneliese", "Friday"),
    ),
    (
        "My sister-in-law Wanjiru visited us over the weekend.",
        "She is training to become an airline pilot.",
        ("Wanjiru", "pilot"),
    ),
    (
        "At the conference I talked for an hour with a researcher named Casimir.",
        "He has been studying glaciers in Patagonia for ten years.",
        ("Casimir", "glacier"),
    ),
    (
        "Our landlord, Mrs Okonkwo, came by to check the heating.",
        "She wants the rent paid by the third of each month.",
        ("Okonkwo", "rent"),
    ),
    (
        "My cousin Leopold is staying with us until March.",
        "He is allergic to shellfish, so no paella this time.",
        ("Leopold", "shellfish"),
    ),
]
"""(the span that names the person, the span that says a fact about them by pronoun, words the fact keeps)."""
