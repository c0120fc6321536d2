"""Peer token-credit methods, each implemented from its paper and registered as a credit method.

``entropy-mask`` (arXiv 2506.01939), ``gtpo`` (arXiv 2508.04349), ``ktae`` (arXiv 2505.16826), ``cf-span``
(arXiv 2602.09331), ``vine`` / ``vine-w`` (VinePPO, arXiv 2410.01679; SPO, arXiv 2505.23564). Each module holds
pure tensor functions; the registration states needs, cost and paper.
"""

from oar.peers import cf_span, entropy_mask, gtpo, ktae, vine  # noqa: F401
