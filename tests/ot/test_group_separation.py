"""The default dissimilarities see the parameter groups of the default synthetic-ridge generator
(fresh seeds, never used to choose the generator or the defaults): Spearman correlation with the
true parameter distances >= 0.5 and same-group AUC >= 0.85; on the equal-mean reading they do not
(the check can fail)."""

import numpy as np
import pytest
from scipy.stats import spearmanr

from fedjax_dro.data import synthetic_ridge
from fedjax_dro.data.synthetic import EQUAL_MEANS_SETTING
from fedjax_dro.ot import dissimilarity_matrix


def _separation(ds):
  theta = np.asarray(ds.true_params, np.float64)
  n = len(theta)
  iu = np.triu_indices(n, 1)
  dist = np.linalg.norm(theta[:, None] - theta[None], axis=-1)[iu]
  D = np.asarray(dissimilarity_matrix(ds.train.x, ds.train.y, ds.train.mask), np.float64)[iu]
  groups = np.arange(n) * 3 // n
  same = (groups[:, None] == groups[None])[iu]
  auc = np.mean((D[same][:, None] < D[~same][None]) + 0.5 * (D[same][:, None] == D[~same][None]))
  return spearmanr(D, dist).correlation, auc


@pytest.mark.parametrize("seed", [1000, 1001, 1002])
def test_default_dissimilarities_separate_the_default_generators_groups(seed):
  rho, auc = _separation(synthetic_ridge(seed))
  assert rho >= 0.5 and auc >= 0.85, (rho, auc)


def test_equal_mean_reading_is_not_separated():
  rho, auc = _separation(synthetic_ridge(1000, **EQUAL_MEANS_SETTING))
  assert rho < 0.5 and auc < 0.85, (rho, auc)
