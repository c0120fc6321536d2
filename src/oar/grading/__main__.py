"""``python -m oar.grading``: the math-verify helper process (see :mod:`oar.grading.verify`)."""

from oar.grading.verify import _serve

_serve()
