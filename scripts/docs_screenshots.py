"""The pictures of the documentation (docs/images/), from a finished CIFAR-10 pipeline run:

    python scripts/docs_screenshots.py --run-dir runs/pipeline-cifar10 --seed 0

* ``gallery_cifar10.png``: the gallery the run's RetrievalEvaluator wrote (its summary.json names it);
* ``search_page.png``: the search page of a service on the run's pushed model, over a folder of
  CIFAR-10 test JPEGs (``--per-class`` of each class, drawn with ``--seed``, exported as
  ``tfhash data export-user`` does), after an upload of one of them, in headless Chromium.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def cifar10_folder(archive: Path, out: Path, per_class: int, seed: int) -> Path:
    """``per_class`` test JPEGs of each class, drawn with ``seed``, as ``out/<class>/<name>.jpg``."""
    with tarfile.open(archive, "r:gz") as tar:
        members = [m for m in tar.getmembers() if m.isfile() and m.name.startswith("test/")]
        rng = np.random.default_rng(seed)
        for name in sorted({m.name.split("/")[1] for m in members}):
            own = [m for m in members if m.name.split("/")[1] == name]
            for i in sorted(rng.choice(len(own), size=min(per_class, len(own)), replace=False)):
                (out / name).mkdir(parents=True, exist_ok=True)
                (out / name / Path(own[i].name).name).write_bytes(tar.extractfile(own[i]).read())
    return out


def page_screenshot(run: dict, photos: Path, work: Path, picture: Path, seed: int) -> None:
    import tensorflow as tf
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    from tfhash.serving.processes import SearchOptions, build_server

    from tfhash.artifacts import ITEMS_FILE, signature_fingerprint
    from tfhash.data.export import export_tfrecords
    from tfhash.data.user import load_user_dataset
    from tfhash.index import index_factory

    model_dir, version = run["model_dir"], str(run["model_version"])
    side = tf.saved_model.load(model_dir).signatures["encode_pixels"].structured_input_signature[1]["pixels"].shape[1]
    dataset = load_user_dataset(images=str(photos), image_size=(side, side), seed=seed)
    export_tfrecords(dataset, work / "data")
    codes = tf.saved_model.load(model_dir).signatures["encode_pixels"](pixels=tf.constant(dataset.inputs["image"]))["packed_codes"].numpy()
    index = index_factory(codes.shape[1] * 8, "BFlat")
    index.add(codes, np.arange(len(codes), dtype=np.int64))
    index.save(str(work / "indexes" / version / "BFlat"), model_version=version, signature_fingerprint=signature_fingerprint(model_dir))
    server = build_server(SearchOptions(index_base_dir=str(work / "indexes"), model_base_dir=os.path.dirname(model_dir), items_file=str(work / "data" / ITEMS_FILE),
                                     image_root=str(photos), rest_port=0)).start()  # fmt: skip
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
                 "--window-size=1100,760", f"--user-data-dir={work / 'profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=shutil.which("chromedriver")), options=options)
    try:
        driver.get(f"http://localhost:{server.rest.port}/")
        query = sorted((photos / "cat").glob("*.jpg"))[0]
        driver.find_element(By.ID, "image-file").send_keys(str(query))
        driver.find_element(By.ID, "search").click()
        WebDriverWait(driver, 120).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#results figure"))
        time.sleep(1)  # the thumbnails
        driver.save_screenshot(str(picture))
    finally:
        driver.quit()
        server.stop(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", required=True, help="a finished run of pipelines/configs/cifar10.json")
    parser.add_argument("--data-root", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--per-class", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "docs" / "images"))
    args = parser.parse_args()
    run = json.loads((Path(args.run_dir) / "summary.json").read_text())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(Path(run["gallery"]).with_name("gallery.png"), out / "gallery_cifar10.png")
    with tempfile.TemporaryDirectory() as work:
        photos = cifar10_folder(Path(args.data_root) / "cifar10" / "cifar10-jpg.tar.gz", Path(work) / "photos", args.per_class, args.seed)
        page_screenshot(run, photos, Path(work), out / "search_page.png", args.seed)
    print(f"wrote {out / 'gallery_cifar10.png'} and {out / 'search_page.png'}")


if __name__ == "__main__":
    main()
