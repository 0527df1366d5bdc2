"""A full or read-only storage filesystem (real ENOSPC / EROFS from a small tmpfs) is a clear
error answer — 507 ``storage_full`` / 503 ``storage_unavailable`` — never a 500 with a traceback,
and it leaves no rows and no files behind (SPEC §2.8)."""

from __future__ import annotations

from sqlalchemy import text

from tests.api.conftest import png_bytes, upload
from tests.support.smallfs import fill, remount_read_only, small_fs


def _rows(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT (SELECT count(*) FROM images) + (SELECT count(*) FROM processing_jobs)"
                                 " + (SELECT count(*) FROM tasks)")).scalar_one()


def _files(root) -> list:
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file() and p.name not in (".filler",))


def test_an_upload_to_a_full_disk_is_a_507_that_leaves_nothing(client, store, engine, settings):
    with small_fs(settings.storage_path) as root:
        fill(root)
        r = upload(client, png_bytes((1, 2, 3), size=(64, 64)))
        assert r.status_code == 507, r.get_data(as_text=True)
        body = r.get_json()
        assert body["error"] == "storage_full" and "storage" in body["message"]
        assert _rows(engine) == 0
        assert _files(root) == []


def test_a_content_replace_on_a_full_disk_is_a_507_that_keeps_the_old_version(client, store, engine, settings):
    with small_fs(settings.storage_path) as root:
        r = upload(client, png_bytes((1, 2, 3)))
        assert r.status_code == 201
        image = r.get_json()["image"]
        before = _files(root)
        fill(root)
        new = {"file": (__import__("io").BytesIO(png_bytes((9, 9, 9), size=(64, 64))), "y.png")}
        r = client.put(f"/api/v1/images/{image['id']}/content", data=new, content_type="multipart/form-data")
        assert r.status_code == 507, r.get_data(as_text=True)
        assert r.get_json()["error"] == "storage_full"
        after = client.get(f"/api/v1/images/{image['id']}").get_json()
        assert after["sha256"] == image["sha256"] and after["revision"] == image["revision"]
        assert _files(root) == before
        assert client.get(f"/api/v1/images/{image['id']}/content").status_code == 200


def test_an_upload_to_read_only_storage_is_a_503(client, store, engine, settings):
    with small_fs(settings.storage_path) as root:
        remount_read_only(root)
        r = upload(client, png_bytes((4, 5, 6)))
        assert r.status_code == 503, r.get_data(as_text=True)
        assert r.get_json()["error"] == "storage_unavailable"
        assert _rows(engine) == 0


def test_a_thumbnail_on_a_full_disk_is_served_uncached(client, settings):
    """The thumbnail cache is derived data: when it cannot be written the thumbnail is still
    made and served (and made again next time), never a 500."""
    with small_fs(settings.storage_path) as root:
        r = upload(client, png_bytes((7, 8, 9), size=(300, 200)))
        image = r.get_json()["image"]
        fill(root)
        for _ in range(2):
            r = client.get(f"/api/v1/images/{image['id']}/thumbnail?size=128")
            assert r.status_code == 200, r.get_data(as_text=True)
            assert r.mimetype == "image/webp" and r.data[:4] == b"RIFF"
        assert not list((root / ".thumbs").rglob("*.webp"))


def test_a_thumbnail_on_read_only_storage_is_served_uncached(client, settings):
    with small_fs(settings.storage_path) as root:
        r = upload(client, png_bytes((7, 8, 10), size=(300, 200)))
        image = r.get_json()["image"]
        remount_read_only(root)
        r = client.get(f"/api/v1/images/{image['id']}/thumbnail?size=128")
        assert r.status_code == 200, r.get_data(as_text=True)
        assert r.mimetype == "image/webp"
