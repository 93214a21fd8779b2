"""report.html opens in a real browser: headless Chromium screenshots it (skipped without Chromium)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from planner.report import build_report, load_inputs

DATA = Path(__file__).parent / "data" / "report"
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install -y chromium)")
def test_report_html_renders_in_headless_chromium(tmp_path):
    rep = build_report(load_inputs(profile=DATA / "profile.csv", run=DATA / "run.json", sim=DATA / "sim.json"),
                       tmp_path / "r", simulate=False)
    # Move the page away from its figures folder: it must not need anything beside it.
    page = tmp_path / "alone.html"
    shutil.copy(rep.html, page)
    shot = tmp_path / "shot.png"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1200,1800",
           page.as_uri()]
    subprocess.run(cmd, capture_output=True, timeout=120, check=False)
    assert shot.is_file(), "Chromium wrote no screenshot"
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)[..., :3]
    # A page with figures has many colors; a blank or broken page has a handful.
    colors = np.unique((pixels.reshape(-1, 3) * 255).astype(np.uint8), axis=0)
    assert len(colors) > 200
    # The memory figure's stacked bars (weights blue #4C72B0) must be on screen, i.e. images loaded.
    blue = np.all(np.abs(pixels - np.array([0x4C, 0x72, 0xB0]) / 255) < 0.03, axis=-1)
    assert blue.sum() > 500
