"""Table checks: every bad table gives one FitError line naming the law, column or rows (1-based data rows)."""

import numpy as np
import pandas as pd
import pytest

from upscale.fitting.data import data_hash, read_table, validate
from upscale.fitting.errors import FitError
from upscale.fitting.laws import get_law

CHIN = get_law("chinchilla")


def table(n: int = 8) -> pd.DataFrame:
    return pd.DataFrame({"D": np.geomspace(1e9, 1e11, n), "N": np.geomspace(1e7, 1e9, n)[::-1],
                         "loss": np.linspace(3.0, 2.0, n)})


def test_missing_column_names_it_and_the_law():
    with pytest.raises(FitError, match=r"law 'chinchilla' needs column\(s\) N; the table has D, loss"):
        validate(CHIN, table().drop(columns="N"), n_free=5)


def test_nan_and_non_positive_values_list_their_rows():
    df = table()
    df.loc[[1, 4], "loss"] = np.nan
    with pytest.raises(FitError, match=r"column 'loss' has NaN, infinite or non-numeric values in row\(s\) 2, 5$"):
        validate(CHIN, df, n_free=5)
    df = table()
    df.loc[[0, 6], "D"] = [0.0, -1e9]
    with pytest.raises(FitError, match=r"column 'D' has zero or negative values in row\(s\) 1, 7;"):
        validate(CHIN, df, n_free=5)


def test_exact_laws_accept_D2_zero_but_not_negative():
    law = get_law("data-mul-exact")
    df = pd.DataFrame({"D1": [1e9, 1e9, 2e9, 2e9, 4e9, 4e9], "D2": [0.0, 1e9, 0.0, 1e9, 0.0, 1e9],
                       "loss": [3.0, 2.8, 2.9, 2.7, 2.8, 2.6]})
    assert len(validate(law, df, n_free=5)) == 6
    with pytest.raises(FitError, match=r"column 'D2' has zero or negative values in row\(s\) 1, 3, 5"):
        validate(get_law("data-mul"), df, n_free=5)
    df.loc[2, "D2"] = -1.0
    with pytest.raises(FitError, match=r"column 'D2' has negative values in row\(s\) 3;"):
        validate(law, df, n_free=5)


def test_fewer_points_than_free_parameters():
    with pytest.raises(FitError, match=r"has 5 free parameter\(s\) but the table has 4 point\(s\); need at least 6"):
        validate(CHIN, table(4), n_free=5)


def test_a_single_valued_column_cannot_fit_its_exponent():
    df = table().assign(N=1e8)
    with pytest.raises(FitError, match=r"column 'N' has a single value \(1e\+08\)"):
        validate(CHIN, df, n_free=5)


def test_read_table_skips_comment_lines_and_reports_a_missing_file(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("# SYNTHETIC\nD,N,loss\n1e9,1e8,3.0\n")
    assert read_table(p).to_dict("list") == {"D": [1e9], "N": [1e8], "loss": [3.0]}
    with pytest.raises(FitError, match="does not exist"):
        read_table(tmp_path / "nope.csv")


def test_data_hash_changes_with_any_value():
    df = table()
    h = data_hash(df, ("D", "N", "loss"))
    assert h == data_hash(df.copy(), ("D", "N", "loss"))
    df.loc[3, "loss"] += 1e-12
    assert h != data_hash(df, ("D", "N", "loss"))
