"""The bundled demo tables are labelled SYNTHETIC and are exactly what fitting/synthetic.py generates."""

import numpy as np
import pandas as pd

from upscale.fitting.data import read_table
from upscale.fitting.synthetic import bundled_path, paper_tables


def test_bundled_tables_are_labelled_and_reproducible():
    fresh = paper_tables()
    for kind in ("dense", "moe", "upcycled"):
        path = bundled_path(kind)
        assert path.read_text().startswith("# SYNTHETIC data, not measurements")
        df = read_table(path)
        assert (df["source"] == "SYNTHETIC").all()
        expected = fresh[kind]
        pd.testing.assert_series_equal(df["trunk"], expected["trunk"], check_names=False)
        np.testing.assert_allclose(df["loss"], expected["loss"], rtol=1e-7)  # written with 8 significant digits
