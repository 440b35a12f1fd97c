#!/usr/bin/env python3
"""The services page's time to first render in headless Chromium (make
bench, part `ui`): loads `URL/ui/#/services` RUNS times, each a fresh page,
and reads the page's own `cairn:services-rendered` performance mark (set
when the first answer of /v1/internal/ui/services is drawn), in ms since
navigation start. Prints `row=ui_render runs=.. rows=.. p50_ms=.. max_ms=..`.

Usage: ui_render.py URL [RUNS]. Needs selenium, chromium, chromedriver."""

import shutil
import sys
import time

from selenium import webdriver
from selenium.webdriver.common.by import By


def main():
    url, runs = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 5
    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium")
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1280,800"):
        opts.add_argument(a)
    d = webdriver.Chrome(options=opts, service=webdriver.ChromeService(executable_path=shutil.which("chromedriver")))
    times, rows = [], 0
    try:
        for i in range(runs):
            d.get(f"{url}/ui/?run={i}#/services")
            deadline = time.monotonic() + 60
            mark = None
            while mark is None:
                if time.monotonic() > deadline:
                    raise SystemExit("the services page did not render within 60 s")
                mark = d.execute_script(
                    "const m = performance.getEntriesByName('cairn:services-rendered');"
                    "return m.length ? m[0].startTime : null;")
                if mark is None:
                    time.sleep(0.02)
            times.append(mark)
            rows = len(d.find_elements(By.CSS_SELECTOR, "#services tbody tr"))
    finally:
        d.quit()
    times.sort()
    print(f"row=ui_render runs={runs} rows={rows} p50_ms={times[len(times) // 2]:.0f} max_ms={times[-1]:.0f}")


if __name__ == "__main__":
    main()
