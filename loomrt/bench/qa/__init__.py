"""``loomrt bench qa``: a real model answers LoCoMo questions after its context was distilled.

See :mod:`loomrt.bench.qa.runner` for the configurations, :mod:`loomrt.bench.qa.grade` for
the grading and :mod:`loomrt.bench.qa.report` for what is written.
"""

from loomrt.bench.qa.grade import abstained, contains, f1, f1_multi, grade, normalize_answer
from loomrt.bench.qa.runner import DEFAULT_CONFIGS, KNOWN_CONFIGS, QAConfig, run_qa, run_qa_async, select_questions

__all__ = [
    "QAConfig",
    "run_qa",
    "run_qa_async",
    "select_questions",
    "DEFAULT_CONFIGS",
    "KNOWN_CONFIGS",
    "grade",
    "f1",
    "f1_multi",
    "contains",
    "abstained",
    "normalize_answer",
]
