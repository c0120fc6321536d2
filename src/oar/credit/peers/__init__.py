"""Peer token-credit methods, each implemented from its paper as pure tensor functions (registered, with their
needs, cost and paper, in :mod:`oar.credit.catalogue`).

``entropy-mask`` (arXiv 2506.01939), ``gtpo`` (arXiv 2508.04349), ``ktae`` (arXiv 2505.16826), ``cf-span``
(arXiv 2602.09331), ``vine`` / ``vine-w`` (arXiv 2410.01679), ``sc-grpo`` (arXiv 2606.18810), ``grail`` (arXiv
2606.04889).
"""
