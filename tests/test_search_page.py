"""The search page of the REST port (``tfhash.serving.page``): served only for loopback hosts,
item images read only from the image root, uploads searched as the service answers them, and the
page itself driven in headless Chromium."""

from __future__ import annotations

import base64
import http.client
import json
import os

import numpy as np
import pytest
from PIL import Image

from tests import browser
from tests.tiers import starts
from tfhash.artifacts import ITEMS_FILE, Item, read_items

SIDE, CLASSES, PER_CLASS, BITS = 16, 3, 6, 16


def photo(colour, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    pixels = np.clip(np.asarray(colour)[None, None] + rng.normal(0, 30, (SIDE, SIDE, 3)), 0, 255).astype(np.uint8)
    return Image.fromarray(pixels)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A folder of photos (three classes), exported; an untrained seeded image model exported and
    its index built, as a run leaves them."""
    import keras
    import tensorflow as tf

    from tfhash.data.export import export_tfrecords
    from tfhash.data.user import load_user_dataset
    from tfhash.export import export_image_model
    from tfhash.index import Embeddings, index_factory
    from tfhash.models import build_scdh, small_cnn

    base = tmp_path_factory.mktemp("page")
    photos = base / "photos"
    for c, (name, colour) in enumerate(zip(("red", "green", "blue"), ((220, 30, 30), (30, 200, 30), (30, 30, 220)), strict=True)):
        (photos / name).mkdir(parents=True)
        for i in range(PER_CLASS):
            photo(colour, 10 * c + i).save(photos / name / f"{i}.png")
    dataset = load_user_dataset(images=str(photos), num_query=3, num_train=15, seed=0)
    data = base / "data"
    export_tfrecords(dataset, data)
    keras.utils.set_random_seed(0)
    model = build_scdh(small_cnn((SIDE, SIDE, 3), width=8, features=32), CLASSES, BITS)
    model(np.zeros((1, SIDE, SIDE, 3), np.uint8))
    export_image_model(model, str(base / "models" / "1"), [SIDE, SIDE, 3], BITS)
    packed = tf.saved_model.load(str(base / "models" / "1")).signatures["encode_pixels"](pixels=tf.constant(dataset.inputs["image"]))
    index, ids = index_factory(BITS, "BFlat"), np.arange(len(dataset.labels), dtype=np.int64)
    index.add(packed["packed_codes"].numpy(), ids)
    from tfhash.artifacts import signature_fingerprint

    index.save(str(base / "indexes" / "1" / "BFlat"), model_version="1", signature_fingerprint=signature_fingerprint(str(base / "models" / "1")),
               embeddings=Embeddings.of(packed["codes"].numpy(), ids))  # fmt: skip
    return {"photos": photos, "data": data, "items": read_items(data / ITEMS_FILE), "base": base}


@pytest.fixture(scope="module")
@starts("server")
def service(exported):
    """The search service in process with REST, the exported items and their image root."""
    from tfhash.serving.processes import SearchOptions, build_server

    base = exported["base"]
    server = build_server(SearchOptions(index_base_dir=str(base / "indexes"), model_base_dir=str(base / "models"), items_file=str(exported["data"] / ITEMS_FILE),
                                     image_root=str(exported["photos"]), rest_port=0, poll_seconds=0.2))  # fmt: skip
    server.start()
    try:
        assert server.searcher.ready
        yield {**exported, "server": server}
    finally:
        server.stop(0)


def request(server, method: str, path: str, body: bytes | None = None, host: str | None = None, headers: dict | None = None):
    connection = http.client.HTTPConnection("127.0.0.1", server.rest.port, timeout=60)
    try:
        connection.putrequest(method, path, skip_host=True)
        connection.putheader("Host", f"localhost:{server.rest.port}" if host is None else host)
        for name, value in {**({"Content-Type": "application/json", "Content-Length": str(len(body))} if body is not None else {}),
                            **(headers or {})}.items():  # fmt: skip
            connection.putheader(name, value)
        connection.endheaders(body)
        response = connection.getresponse()
        return response.status, response.getheader("Content-Type"), response.read()
    finally:
        connection.close()


def test_export_user_records_the_image_root(exported):
    metadata = json.loads((exported["data"] / "metadata.json").read_text())
    assert metadata["image_root"] == str(exported["photos"].resolve())


def test_the_page_is_served_to_loopback_hosts_only(service):
    server = service["server"]
    status, kind, body = request(server, "GET", "/")
    assert status == 200 and kind.startswith("text/html") and b"<title>tfhash search</title>" in body
    for host in ("127.0.0.1", f"[::1]:{server.rest.port}", "localhost"):
        assert request(server, "GET", "/", host=host)[0] == 200
    for host in ("attacker.example", f"attacker.example:{server.rest.port}", "10.0.0.7", "localhost.attacker.example", ""):
        status, _, body = request(server, "GET", "/", host=host)
        assert status == 403 and b"PERMISSION_DENIED" in body, host
        assert request(server, "GET", "/v1/items/0/image", host=host)[0] == 403
        assert request(server, "POST", "/v1/search-image", b"{}", host=host)[0] == 403


def test_an_item_image_is_its_file_and_only_an_indexed_one(service):
    server, items = service["server"], service["items"]
    item_id = next(iter(items))
    status, kind, body = request(server, "GET", f"/v1/items/{item_id}/image")
    assert status == 200 and kind == "image/png" and body == (service["photos"] / items[item_id].path).read_bytes()
    status, _, body = request(server, "GET", f"/v1/items/{item_id}")
    assert status == 200 and json.loads(body) == {"id": item_id, "path": items[item_id].path, "labels": list(items[item_id].labels)}
    assert request(server, "GET", "/v1/items/99999/image")[0] == 404
    (service["base"] / "secret.txt").write_text("not for the page")
    for path in ("/v1/items/../../secret.txt", "/v1/items/%2e%2e/%2e%2e/secret.txt", "/v1/items/0/../../../secret.txt",
                 "/v1/items/..%2f..%2fsecret.txt/image", "/v1/items/0/image/..%2f..%2f..%2fsecret.txt", "/..%2f..%2fsecret.txt"):
        status, _, body = request(server, "GET", path)
        assert status in (400, 404) and b"not for the page" not in body, path


def test_item_files_outside_the_root_are_refused(exported, tmp_path):
    from tfhash.serving.errors import ServingError
    from tfhash.serving.page import ItemImages

    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    photo((1, 2, 3), 0).save(root / "a" / "fine.png")
    photo((1, 2, 3), 1).save(tmp_path / "outside.png")
    (root / "a" / "link.png").symlink_to(tmp_path / "outside.png")
    (root / "a" / "notes.png").write_text("a text file named like an image")
    (root / "a" / "big.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(11 << 20))
    items = {1: Item("a/fine.png", ("a",)), 2: Item("../outside.png", ("a",)), 3: Item(str(tmp_path / "outside.png"), ("a",)),
             4: Item("a/link.png", ("a",)), 5: Item("a/notes.png", ("a",)), 6: Item("a/../../outside.png", ("a",)),
             7: Item("", ()), 8: Item("a/big.png", ("a",)), 9: Item("a\\..\\..\\outside.png", ("a",))}  # fmt: skip
    images = ItemImages(root, items, exported["data"])
    assert images.read(1) == ((root / "a" / "fine.png").read_bytes(), "image/png")
    expected = {2: "PERMISSION_DENIED", 3: "PERMISSION_DENIED", 4: "PERMISSION_DENIED", 5: "PERMISSION_DENIED",
                6: "PERMISSION_DENIED", 7: "NOT_FOUND", 8: "RESOURCE_EXHAUSTED", 9: "PERMISSION_DENIED", 10: "NOT_FOUND"}  # fmt: skip
    for item_id, code in expected.items():
        with pytest.raises(ServingError) as caught:
            images.read(item_id)
        assert caught.value.code.name == code, (item_id, caught.value.message)
    with pytest.raises(ValueError, match="is not a folder"):
        ItemImages(tmp_path / "missing", items, exported["data"])


def test_an_upload_is_searched_as_the_service_answers_that_image(service):
    from tfhash.data.user import image_query

    server, photos = service["server"], service["photos"]
    query = photos / "green" / "2.png"
    body = json.dumps({"image": base64.b64encode(query.read_bytes()).decode(), "k": 5}).encode()
    status, _, answer = request(server, "POST", "/v1/search-image", body)
    assert status == 200, answer
    answer = json.loads(answer)
    expected = request(server, "POST", "/v1/search", json.dumps({"examples": [base64.b64encode(image_query(query, service["data"])).decode()],
                                                                 "k": 5}).encode())  # fmt: skip
    assert answer == json.loads(expected[2]) and answer["model_version"] == "1" and len(answer["results"][0]["ids"]) == 5
    own = next(i for i, item in service["items"].items() if item.path.endswith("green/2.png"))
    assert answer["refined"] and answer["results"][0]["ids"][0] == own  # the photo's own item first: the second stage


def test_bad_uploads_are_refused_with_a_clear_status(service):
    server = service["server"]
    text = base64.b64encode(b"just some text, not an image" * 10).decode()
    cases = {
        "non-image": (json.dumps({"image": text}).encode(), 400, "not an image"),
        "bad base64": (b'{"image": "***"}', 400, "invalid base64"),
        "no image": (b'{"k": 3}', 400, "needs image"),
        "unknown field": (b'{"image": "", "path": "/etc/passwd"}', 400, "unknown fields"),
        "truncated png": (json.dumps({"image": base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(40)).decode()}).encode(), 400, "cannot read"),
    }
    for name, (body, status, message) in cases.items():
        got, _, answer = request(server, "POST", "/v1/search-image", body)
        assert got == status and message in json.loads(answer)["error"]["message"], (name, answer)
    connection = http.client.HTTPConnection("127.0.0.1", server.rest.port, timeout=30)  # a 20 MB image: refused on the headers
    try:
        connection.putrequest("POST", "/v1/search-image", skip_host=True)
        for name, value in (("Host", "localhost"), ("Content-Type", "application/json"), ("Content-Length", str((20 << 20) * 4 // 3 + 12))):
            connection.putheader(name, value)
        connection.endheaders()
        response = connection.getresponse()
        assert response.status == 413 and b"RESOURCE_EXHAUSTED" in response.read()
    finally:
        connection.close()


def test_without_an_image_root_the_page_does_not_exist(service):
    from tfhash.serving.processes import SearchOptions, build_server

    base = service["base"]
    server = build_server(SearchOptions(index_base_dir=str(base / "indexes"), model_base_dir=str(base / "models"), items_file=str(service["data"] / ITEMS_FILE),
                                     rest_port=0))  # fmt: skip
    try:
        server.start()
        for path in ("/", "/v1/items/0/image", "/v1/items/0"):
            assert request(server, "GET", path)[0] == 404
    finally:
        server.stop(0)


@pytest.mark.process
@browser.SKIP
def test_the_page_in_a_browser_shows_the_services_answer(service, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from tfhash.data.user import image_query

    server, photos = service["server"], service["photos"]
    driver = browser.chromium(tmp_path / "profile")
    try:
        driver.get(f"http://localhost:{server.rest.port}/")
        query = photos / "blue" / "4.png"
        driver.find_element(By.ID, "image-file").send_keys(str(query))
        driver.find_element(By.ID, "k").clear()
        driver.find_element(By.ID, "k").send_keys("6")
        driver.find_element(By.ID, "search").click()
        WebDriverWait(driver, 60).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#results figure")) == 6)
        shown = [int(f.get_attribute("data-id")) for f in driver.find_elements(By.CSS_SELECTOR, "#results figure")]
        _, _, expected = request(server, "POST", "/v1/search", json.dumps({"examples": [base64.b64encode(image_query(query, service["data"])).decode()],
                                                                           "k": 6}).encode())  # fmt: skip
        assert shown == json.loads(expected)["results"][0]["ids"]
        WebDriverWait(driver, 30).until(lambda d: all(d.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", img)
                                                      for img in d.find_elements(By.CSS_SELECTOR, "#results img")))  # fmt: skip
        assert "model version 1" in driver.find_element(By.ID, "status").text
        # an item of the index as the query: its labels are known, so wrong answers are framed
        item_id = next(i for i, item in service["items"].items() if item.labels == ("red",))
        driver.find_element(By.ID, "item-id").send_keys(str(item_id))
        driver.find_element(By.ID, "search").click()
        WebDriverWait(driver, 60).until(lambda d: f"item {item_id}" in d.find_element(By.ID, "status").text)
        figures = driver.find_elements(By.CSS_SELECTOR, "#results figure")
        labels = {int(f.get_attribute("data-id")): service["items"][int(f.get_attribute("data-id"))].labels for f in figures}
        wrong = {int(f.get_attribute("data-id")) for f in figures if "wrong" in (f.get_attribute("class") or "")}
        assert wrong == {i for i, names in labels.items() if "red" not in names}
        # the second stage by default: the item first; unticked, the service's Hamming order
        assert int(figures[0].get_attribute("data-id")) == item_id
        assert "ordered by the embeddings" in driver.find_element(By.ID, "status").text
        driver.find_element(By.ID, "refine").click()
        driver.find_element(By.ID, "search").click()
        WebDriverWait(driver, 60).until(lambda d: "in Hamming order" in d.find_element(By.ID, "status").text)
        shown = [int(f.get_attribute("data-id")) for f in driver.find_elements(By.CSS_SELECTOR, "#results figure")]
        upload = base64.b64encode((photos / service["items"][item_id].path).read_bytes()).decode()
        _, _, expected = request(server, "POST", "/v1/search-image", json.dumps({"image": upload, "k": 6, "refine": False}).encode())
        assert shown == json.loads(expected)["results"][0]["ids"] and not json.loads(expected)["refined"]
        screenshots = os.environ.get("TFHASH_SCREENSHOTS")
        if screenshots:
            driver.save_screenshot(os.path.join(screenshots, "search_page.png"))
    finally:
        driver.quit()


@pytest.mark.process
@pytest.mark.server
@browser.SKIP
def test_the_page_asks_for_the_token_of_a_service_that_needs_one(exported, tmp_path):
    """A service with --token-file: the page's HTML loads without it, the first search answers 401
    and the page shows the token field; with the token, the answer and its images (fetched with the
    token) are shown."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    from tfhash.serving.access import Access
    from tfhash.serving.processes import SearchOptions, build_server

    token = tmp_path / "token"
    token.write_text("page-test-token-0123456789\n")
    base = exported["base"]
    server = build_server(SearchOptions(index_base_dir=str(base / "indexes"), model_base_dir=str(base / "models"), items_file=str(exported["data"] / ITEMS_FILE),
                                     image_root=str(exported["photos"]), rest_port=0, poll_seconds=60, access=Access(token_file=str(token))))  # fmt: skip
    server.start()
    driver = browser.chromium(tmp_path / "profile")
    try:
        assert request(server, "GET", "/v1/items/0/image")[0] == 401
        driver.get(f"http://localhost:{server.rest.port}/")
        assert not driver.find_element(By.ID, "token-field").is_displayed()
        driver.find_element(By.ID, "item-id").send_keys("0")
        driver.find_element(By.ID, "search").click()
        WebDriverWait(driver, 60).until(lambda d: "needs a token" in d.find_element(By.ID, "status").text)
        assert driver.find_element(By.ID, "token-field").is_displayed() and not driver.find_elements(By.CSS_SELECTOR, "#results figure")
        driver.find_element(By.ID, "token").send_keys("page-test-token-0123456789")
        driver.find_element(By.ID, "search").click()
        WebDriverWait(driver, 60).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#results figure")) == 10)
        WebDriverWait(driver, 30).until(lambda d: all(d.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", img)
                                                      for img in d.find_elements(By.CSS_SELECTOR, "#results img")))  # fmt: skip
        assert "model version 1" in driver.find_element(By.ID, "status").text
    finally:
        driver.quit()
        server.stop(0)


def test_the_command_refuses_an_image_root_without_items(exported, tmp_path):
    from click.testing import CliRunner

    from tfhash.cli import main

    base = exported["base"]
    result = CliRunner().invoke(main, ["serve", "search", "--index-base-dir", str(base / "indexes"), "--model-base-dir", str(base / "models"),
                                       "--image-root", str(exported["photos"])])  # fmt: skip
    assert result.exit_code == 2 and "--image-root shows the items of --items" in result.output, result.output
    from tfhash.serving.cli import exported_image_root

    assert exported_image_root(str(exported["data"] / ITEMS_FILE)) == str(exported["photos"].resolve())
    (tmp_path / ITEMS_FILE).write_text("id,path,labels\n")
    assert exported_image_root(str(tmp_path / ITEMS_FILE)) is None  # no metadata.json beside it: no page
