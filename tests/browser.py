"""Headless Chromium for the browser tests: Debian's ``chromium`` and ``chromedriver``, driven by
Selenium (``scripts/run_tests.sh`` installs them where they are missing and it runs as root; a test
that needs them is skipped with :data:`SKIP` elsewhere)."""

from __future__ import annotations

import shutil

import pytest

#: The mark of a test that drives the browser: it starts a process, and is skipped without one.
SKIP = pytest.mark.skipif(not (shutil.which("chromium") and shutil.which("chromedriver")),
                          reason="headless Chromium and ChromeDriver are not installed (scripts/run_tests.sh installs Debian's "
                                 "chromium and chromium-driver when it runs as root)")  # fmt: skip


def chromium(profile, width: int = 1100, height: int = 900):
    """A headless Chromium session (Selenium WebDriver) with its own empty ``profile`` folder and
    no background networking (the machines' closed network refuses it)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", f"--window-size={width},{height}", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(executable_path=shutil.which("chromedriver")), options=options)
