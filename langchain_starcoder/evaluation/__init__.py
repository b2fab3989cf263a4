"""Does it complete my code well? Holes cut from a repository's own files, scored as CrossCodeEval
scores them, per configuration, hole kind and language (issue 40)."""

from .configs import Config, parse_configs
from .holes import KINDS, Hole, HoleNotice, cut_holes
from .metrics import Scores, cceval_truncate, score
from .report import Comparison, Difference, EvalReport, HoleRecord
from .runner import evaluate
from .targets import CompletionsEndpoint, InfillEndpoint

__all__ = [
    "KINDS",
    "Comparison",
    "CompletionsEndpoint",
    "Config",
    "Difference",
    "EvalReport",
    "Hole",
    "HoleNotice",
    "HoleRecord",
    "InfillEndpoint",
    "Scores",
    "cceval_truncate",
    "cut_holes",
    "evaluate",
    "parse_configs",
    "score",
]
