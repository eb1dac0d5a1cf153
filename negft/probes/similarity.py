"""The one way probes score a query against candidates: bit-identical candidates get bit-identical scores.

Benchmarks are full of exact ties: ARO's perturbations often return the caption unchanged, SNARE's options can
coincide, a retrieval gallery holds one image in several rows, zero-shot class names can repeat. A tie rule
(negft's shared credit, or a reference's "first option wins") only means something if tied candidates really
score the same. A BLAS product does not promise that: ``torch.einsum("nd,nkd->nk")`` in float32 gives two
identical option vectors scores about 1e-8 apart depending on their column (measured on 60-90% of rows at
d = 128, 512 and 768 with k = 2, 5, 6, on an AVX2 CPU and on an AVX-512 one), so a tie became a win or a loss
at random. NegBench's own MCQ scorer (``torch.einsum('bf,nbf->bn')``) does the same, so its number on a file with
duplicate options depends on the machine; ARO's (``np.einsum`` without ``optimize``) and SugarCrepe's (one
product per caption) keep ties exact.

Two forms, both exact by construction:

- ``option_scores`` / ``grid_scores``: each query against its own few candidates as an element-wise product
  summed over the feature axis: every score is the same multiplications followed by the same reduction, so
  equal inputs give equal outputs whatever the candidate's position. Kept out of ``torch.compile``, whose fused
  reductions may treat output positions differently.
- ``score_matrix``: every query against a shared gallery (retrieval, zero-shot) as one matrix product over the
  *distinct* queries and candidates, indexed back: a duplicated row or column is one computed value, copied.
"""
from __future__ import annotations

import torch

CHUNK = 1 << 22            # elements of the product held at once by option_scores / grid_scores (16 MB)


@torch.compiler.disable
def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Σ_d a·b over the last axis, broadcasting the others; the product is chunked along the first axis."""
    shape = torch.broadcast_shapes(a.shape, b.shape)
    a, b = a.expand(shape), b.expand(shape)
    if not shape[0]:
        return a.new_zeros(shape[:-1])
    rows = max(1, CHUNK // max(1, shape[1:].numel()))
    return torch.cat([(a[i:i + rows] * b[i:i + rows]).sum(-1) for i in range(0, shape[0], rows)])


def option_scores(queries: torch.Tensor, options: torch.Tensor) -> torch.Tensor:
    """(N, K) scores of each query (N, D) against its own K options (N, K, D)."""
    return _dot(queries.unsqueeze(1), options)


def caption_pair_scores(ctx, images: list[str], captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """(s(image, positive), s(image, negative)) per row, from the rows' images and their captions, each row's
    positive then negative (``ctx`` an EvalContext, which encodes them)."""
    encoded_images = ctx.encode_images(images)
    encoded = ctx.encode_texts(captions).view(len(images), 2, -1)
    return option_scores(encoded_images, encoded).unbind(1)


def grid_scores(texts: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
    """(N, C, I) scores of each example's C texts (N, C, D) against its I images (N, I, D): s[n, text, image]."""
    return _dot(texts.unsqueeze(2), images.unsqueeze(1))


def score_matrix(queries: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """(Q, C) scores of every query (Q, D) against every candidate (C, D): ``queries @ candidates.T`` over the
    distinct rows of each, so equal queries give equal rows and equal candidates equal columns."""
    uq, iq = torch.unique(queries, dim=0, return_inverse=True)
    uc, ic = torch.unique(candidates, dim=0, return_inverse=True)
    return (uq @ uc.T)[iq][:, ic]
