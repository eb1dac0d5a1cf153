"""The scoring primitive every probe uses: identical candidates score identically, at realistic widths, in every
column position, on whatever CPU runs the suite (a float32 BLAS product does not: ``negft.probes.similarity``)."""
import pytest
import torch
import torch.nn.functional as F

from negft.probes.similarity import grid_scores, option_scores, score_matrix


def _features(*shape, seed=0):
    return F.normalize(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)), dim=-1)


@pytest.mark.parametrize("d", [512, 768])
@pytest.mark.parametrize("k", [2, 3, 4, 5, 6])
def test_identical_options_get_identical_scores_in_every_column(d, k):
    n = 300
    queries, options = _features(n, d), _features(n, k, d, seed=1)
    for j in range(k):                       # row r copies option (r mod k) into column j: every pair of columns
        src = torch.arange(n) % k
        rows = torch.arange(n)[src != j]
        options[rows, j] = options[rows, src[rows]]
    s = option_scores(queries, options)
    src = torch.arange(n) % k
    assert torch.equal(s, s.gather(1, src.view(-1, 1)).expand(-1, k))
    assert torch.allclose(s, torch.einsum("nd,nkd->nk", queries, options), atol=1e-6)


def test_identical_candidates_tie_under_torch_compile():
    queries, options = _features(64, 512), _features(64, 5, 512, seed=2)
    options[:, 3] = options[:, 1]
    compiled = torch.compile(lambda q, o: option_scores(q * 1.0, o))
    s = compiled(queries, options)
    assert torch.equal(s[:, 1], s[:, 3])


def test_grid_scores_tie_identical_texts_and_identical_images():
    texts, images = _features(200, 2, 768), _features(200, 2, 768, seed=3)
    texts[:100, 1] = texts[:100, 0]
    images[100:, 1] = images[100:, 0]
    s = grid_scores(texts, images)                           # s[n, text, image]
    assert torch.equal(s[:100, 0], s[:100, 1])
    assert torch.equal(s[100:, :, 0], s[100:, :, 1])
    assert torch.allclose(s, torch.einsum("ncd,nid->nci", texts, images), atol=1e-6)


@pytest.mark.parametrize("d", [512, 768])
def test_score_matrix_ties_duplicate_gallery_items_and_duplicate_queries(d):
    gallery, queries = _features(40, d), _features(300, d, seed=4)
    gallery[[7, 19, 33]] = gallery[4].clone()                       # one image in four rows
    queries[150:] = queries[:150].clone()
    s = score_matrix(queries, gallery)
    for j in (7, 19, 33):
        assert torch.equal(s[:, 4], s[:, j])
    assert torch.equal(s[150:], s[:150])
    assert torch.allclose(s, queries @ gallery.T, atol=1e-6)


def test_empty_inputs_give_empty_scores():
    assert option_scores(torch.zeros(0, 8), torch.zeros(0, 3, 8)).shape == (0, 3)
