"""The pictures of the documentation (docs/images/), in headless Chromium. From a finished
CIFAR-10 pipeline run:

    python scripts/docs_screenshots.py --run-dir runs/pipeline-cifar10 --seed 0

* ``gallery_cifar10.png``: the gallery the run's RetrievalEvaluator wrote (its summary.json names it);
* ``search_page.png``: the search page of a service on the run's pushed model, over a folder of
  CIFAR-10 test JPEGs (``--per-class`` of each class, drawn with ``--seed``, exported as
  ``tfhash data export-user`` does, indexed with their embeddings), after an upload of one of them.

From the search page of a running service (the own-photos journey of docs/own-images.md):

    python scripts/docs_screenshots.py --page http://localhost:8601 --items runs/photos/data/items.csv --label cat

* ``second_stage_page.png``: two items of class ``--label`` (drawn with ``--seed``) searched by
  their own image, the second stage on, and the first again in Hamming order; the items shown are
  printed with what they show (each item first; the next answers differ between the two queries).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the browser of the tests (tests/browser.py)
    sys.path.insert(0, str(ROOT))

from tests.browser import chromium  # noqa: E402


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
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    from tfhash.serving.processes import SearchOptions, build_server

    from tfhash.artifacts import ITEMS_FILE, signature_fingerprint
    from tfhash.data.export import export_tfrecords
    from tfhash.data.user import load_user_dataset
    from tfhash.index import Embeddings, index_factory

    model_dir, version = run["model_dir"], str(run["model_version"])
    side = tf.saved_model.load(model_dir).signatures["encode_pixels"].structured_input_signature[1]["pixels"].shape[1]
    dataset = load_user_dataset(images=str(photos), image_size=(side, side), seed=seed)
    export_tfrecords(dataset, work / "data")
    encoded = tf.saved_model.load(model_dir).signatures["encode_pixels"](pixels=tf.constant(dataset.inputs["image"]))
    codes, ids = encoded["packed_codes"].numpy(), np.arange(len(dataset.inputs["image"]), dtype=np.int64)
    index = index_factory(codes.shape[1] * 8, "BFlat")
    index.add(codes, ids)
    index.save(str(work / "indexes" / version / "BFlat"), model_version=version, signature_fingerprint=signature_fingerprint(model_dir),
               embeddings=Embeddings.of(encoded["codes"].numpy(), ids))  # fmt: skip
    server = build_server(SearchOptions(index_base_dir=str(work / "indexes"), model_base_dir=os.path.dirname(model_dir), items_file=str(work / "data" / ITEMS_FILE),
                                     image_root=str(photos), rest_port=0)).start()  # fmt: skip
    driver = chromium(work / "profile", 1100, 760)
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


def searched_item(driver, item_id: int, refine: bool, k: int) -> tuple[list[int], bytes]:
    """Search the page for item ``item_id`` by its own image (the second stage on or off): the ids
    shown, and a PNG of the page once its thumbnails have loaded."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    box = driver.find_element(By.ID, "item-id")
    box.clear()
    box.send_keys(str(item_id))
    driver.find_element(By.ID, "k").clear()
    driver.find_element(By.ID, "k").send_keys(str(k))
    if driver.find_element(By.ID, "refine").is_selected() != refine:
        driver.find_element(By.ID, "refine").click()
    driver.find_element(By.ID, "search").click()
    said = "ordered by the embeddings" if refine else "in Hamming order"
    WebDriverWait(driver, 120).until(lambda d: f"item {item_id} " in d.find_element(By.ID, "status").text and said in d.find_element(By.ID, "status").text)
    WebDriverWait(driver, 60).until(lambda d: all(d.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", img)
                                                  for img in d.find_elements(By.CSS_SELECTOR, "#results img, #query img")))  # fmt: skip
    return [int(f.get_attribute("data-id")) for f in driver.find_elements(By.CSS_SELECTOR, "#results figure")], driver.get_screenshot_as_png()


def second_stage_screenshot(page: str, items_file: Path, label: str, picture: Path, seed: int, k: int = 5) -> dict:
    """``second_stage_page.png`` (the module docstring) from the page at ``page``; returns what
    each panel shows."""
    import io

    from PIL import Image

    from tfhash.artifacts import read_items

    items = read_items(items_file)
    of_label = sorted(i for i, item in items.items() if label in item.labels)
    if len(of_label) < 2:
        raise SystemExit(f"{items_file}: fewer than two items of class {label!r}; choose another --label")
    first, second = (int(i) for i in np.random.default_rng(seed).choice(of_label, 2, replace=False))
    with tempfile.TemporaryDirectory() as profile:
        driver = chromium(profile, 1000, 650)
        try:
            driver.get(page.rstrip("/") + "/")
            panels = [(first, True), (second, True), (first, False)]
            shown = [searched_item(driver, item, refine, k) for item, refine in panels]
        finally:
            driver.quit()
    images = [Image.open(io.BytesIO(png)).convert("RGB") for _, png in shown]
    sheet = Image.new("RGB", (images[0].width, sum(i.height for i in images) + 8 * (len(images) - 1)), "#888888")
    for i, image in enumerate(images):
        sheet.paste(image, (0, i * (images[0].height + 8)))
    sheet.save(picture, optimize=True)
    report = {f"item {item}, {'second stage' if refine else 'Hamming order'}": ids for (item, refine), (ids, _) in zip(panels, shown, strict=True)}
    report["each item first with the second stage"] = shown[0][0][0] == first and shown[1][0][0] == second
    report["next answers shared by the two items"] = sorted(set(shown[0][0][1:]) & set(shown[1][0][1:]))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", help="a finished run of pipelines/configs/cifar10.json")
    parser.add_argument("--page", help="the address of a search page (instead of --run-dir): second_stage_page.png")
    parser.add_argument("--items", help="with --page: the items.csv of the service's data")
    parser.add_argument("--label", help="with --page: the class of the two items searched")
    parser.add_argument("--data-root", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--per-class", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "docs" / "images"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.page:
        if not (args.items and args.label):
            parser.error("--page needs --items and --label")
        report = second_stage_screenshot(args.page, Path(args.items), args.label, out / "second_stage_page.png", args.seed)
        print(json.dumps(report, indent=2), f"\nwrote {out / 'second_stage_page.png'}")
        return
    if not args.run_dir:
        parser.error("pass --run-dir, or --page")
    run = json.loads((Path(args.run_dir) / "summary.json").read_text())
    shutil.copyfile(Path(run["gallery"]).with_name("gallery.png"), out / "gallery_cifar10.png")
    with tempfile.TemporaryDirectory() as work:
        photos = cifar10_folder(Path(args.data_root) / "cifar10" / "cifar10-jpg.tar.gz", Path(work) / "photos", args.per_class, args.seed)
        page_screenshot(run, photos, Path(work), out / "search_page.png", args.seed)
    print(f"wrote {out / 'gallery_cifar10.png'} and {out / 'search_page.png'}")


if __name__ == "__main__":
    main()
