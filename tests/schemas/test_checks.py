"""schemas.checks: URI and placeholder checks, credential masking, bounded reprs, locations."""

from __future__ import annotations

import os

import pytest

from schemas.checks import (
    INPUT_PLACEHOLDERS,
    OUTPUT_PLACEHOLDERS,
    FieldError,
    check_output_root,
    check_uri,
    location,
    shown,
    without_userinfo,
)

SECRET = "S3cretFAKE0000/with+slash"


@pytest.mark.parametrize(
    "uri",
    ["s3://bucket/docs/", "gs://b/x", "gcs://b/x", "file:///tmp/x", "memory://x", "docs/in",
     "/abs/path", "C:/data/x", "C:\\data\\x"],
)
def test_supported_schemes_plain_paths_and_windows_drives_are_accepted(uri):
    assert check_uri(uri, INPUT_PLACEHOLDERS) == uri


@pytest.mark.parametrize("uri, scheme", [("ftp://host/x", "ftp://"), ("https://host/x", "https://"),
                                         ("S3://bucket/x", "S3://"), ("s3::file://x", "s3::file://")])
def test_an_unsupported_scheme_is_refused_naming_the_allowed_ones(uri, scheme):
    with pytest.raises(ValueError) as e:
        check_uri(uri, INPUT_PLACEHOLDERS)
    said = str(e.value)
    assert f"unsupported scheme {scheme!r}" in said
    assert "s3://, gs://" in said and "or a plain path" in said


def test_a_scheme_without_two_slashes_is_refused_with_the_spelling_to_use():
    with pytest.raises(ValueError, match=r"malformed: write s3://\.\.\. \(two slashes\)"):
        check_uri("s3:bucket/x", INPUT_PLACEHOLDERS)


def test_an_empty_uri_is_refused():
    with pytest.raises(ValueError, match="is empty; allowed: a path or a URI"):
        check_uri("   ", INPUT_PLACEHOLDERS)


def test_placeholders_are_allowed_per_side_input_takes_run_date_only():
    assert check_uri("s3://b/{run_date}/x", INPUT_PLACEHOLDERS)
    assert check_uri("s3://b/{job}/{run_date}", OUTPUT_PLACEHOLDERS)
    with pytest.raises(ValueError, match=r"unknown placeholder \{job\}; allowed: \{run_date\}$"):
        check_uri("s3://b/{job}", INPUT_PLACEHOLDERS)
    with pytest.raises(ValueError, match=r"unknown placeholder \{date\}; allowed: \{job\}, \{run_date\}"):
        check_uri("out/{date}", OUTPUT_PLACEHOLDERS)


@pytest.mark.parametrize("uri", ["s3://b/{run_date", "s3://b/run_date}/x"])
def test_an_unbalanced_brace_is_refused(uri):
    with pytest.raises(ValueError, match="unbalanced brace"):
        check_uri(uri, INPUT_PLACEHOLDERS)


@pytest.mark.parametrize("secret", ["abcd", SECRET, ""])
def test_a_uri_with_credentials_is_refused_and_masked(secret):
    uri = f"s3://AKIAFAKE:{secret}@bucket/docs/{{job}}"
    with pytest.raises(ValueError) as e:
        check_uri(uri, OUTPUT_PLACEHOLDERS)
    said = str(e.value)
    assert "holds credentials before '@' (s3://***@bucket/docs/{job})" in said
    assert "AKIAFAKE" not in said and (not secret or secret not in said)
    assert "fix: remove them from the URI" in said and "AWS_SECRET_ACCESS_KEY" in said


@pytest.mark.parametrize("uri", ["https://user:Tok3nFAKE@host/docs", "S3://AKIAFAKE:Tok3nFAKE@bucket/x"])
def test_credentials_in_a_uri_with_an_unsupported_scheme_are_not_echoed(uri):
    with pytest.raises(ValueError) as e:
        check_uri(uri, INPUT_PLACEHOLDERS)
    assert "Tok3nFAKE" not in str(e.value)


def test_a_secret_holding_an_at_sign_is_not_echoed():
    with pytest.raises(ValueError, match="holds credentials") as e:
        check_uri("s3://AKIAFAKE:Tok3n@FAKEtail@bucket/x", INPUT_PLACEHOLDERS)
    assert "FAKEtail" not in str(e.value)


def test_without_userinfo_masks_every_url_and_keeps_ports_and_plain_urls():
    text = f"see https://u:{SECRET}@host/x and s3://token@b/y and s3://b/c"
    assert without_userinfo(text) == "see https://***@host/x and s3://***@b/y and s3://b/c"
    assert without_userinfo("http://head:8265/api") == "http://head:8265/api"


def test_shown_cuts_a_huge_value_to_a_bounded_repr():
    long = shown("x" * 1_000_000)
    assert len(long) <= 82 and "..." in long
    assert shown(list(range(10_000))) == "[0, 1, 2, 3, 4, 5, ...]"
    assert shown("short") == "'short'"


def test_location_gives_one_spelling_per_place():
    assert location("gcs://b/a/../c//d/") == location("gs://b/c/d") == "gs://b/c/d"
    assert location("s3://b/./x") == "s3://b/x"
    assert location("file:///tmp/a/../b") == location("/tmp/b") == "/tmp/b"
    assert location("rel/./p") == os.path.join(os.getcwd(), "rel", "p")
    assert location("~/x") == os.path.join(os.path.expanduser("~"), "x")


@pytest.mark.parametrize("uri", ["s3://bucket", "gs://bucket/", "gcs://b", "/", ".", "..", "~",
                                 "out/..", "file:///", ""])
def test_an_output_root_without_a_parent_folder_is_refused(uri):
    with pytest.raises(ValueError, match=r"names no folder with a parent.*\{output\}\.runs/.*e\.g\."):
        check_output_root(uri)


@pytest.mark.parametrize("uri", ["s3://bucket/longdoc", "out/{job}", "memory://x", "/tmp/out"])
def test_an_output_root_with_a_parent_folder_is_accepted(uri):
    assert check_output_root(uri) == uri


def test_field_error_names_its_field_and_is_a_value_error():
    err = FieldError("task.questions", "got []; allowed: at least 1")
    assert isinstance(err, ValueError)
    assert (err.field, err.message) == ("task.questions", "got []; allowed: at least 1")
    assert str(err) == "task.questions: got []; allowed: at least 1"


def test_a_user_name_holding_an_at_sign_does_not_unmask_the_secret():
    """An e-mail address as the user: the credentials run to the last '@', whatever the scheme."""
    for uri in ("s3://me@corp.com:s3cr3t@host/x", "https://me@corp.com:s3cr3t@host/x"):
        with pytest.raises(ValueError, match="holds credentials") as e:
            check_uri(uri, INPUT_PLACEHOLDERS)
        assert "s3cr3t" not in str(e.value) and "corp.com" not in str(e.value)
