"""oar.lab.task's failure classes of a lab completion and token kinds (the greedy-drop study's, docs/studies)."""

from __future__ import annotations

from oar.lab.task import TaskConfig, failure_kind, make_split, token_kinds

PROMPT = "57+8-6+9="  # 65, 59, 68


def test_each_failure_class():
    cases = {
        "57+8=65; 65-6=59; 59+9=68; \\boxed{68}": "right",
        "57+8=65; 65-6=58; 58+9=67; \\boxed{67}": "wrong c",
        "57+8=65; 64-6=58; 58+9=67; \\boxed{67}": "wrong a",
        "57+8=65; 65-5=60; 60+9=69; \\boxed{69}": "wrong b",
        "57+8=65; 65+9=74; \\boxed{74}": "step skipped",
        "57+8=65; 65-6=59; 59+9=68; 68+1=69; \\boxed{69}": "extra step",
        "57+8=65; 65-6=59; \\boxed{59}": "steps right, box wrong",
        "57+8=65; 65-6=59; 59+9=68; \\boxed{6": "no boxed answer",
        "57+08=65; 65-6=58; \\boxed{58}": "wrong c",  # a zero-padded operand is still the prompt's operand
    }
    for completion, expected in cases.items():
        assert failure_kind(PROMPT, completion, 68) == expected, completion


def test_token_kinds_split_pivotal_digits_by_role():
    p = make_split(TaskConfig(), "test", 1)[0]
    kinds = token_kinds(p.completion, p.labels)
    assert len(kinds) == len(p.completion) and "pivotal" not in kinds
    first = p.completion.index("=")
    assert kinds[first + 1] == "result" and kinds[0] == "copied" and kinds[first - 1] == "operand"
