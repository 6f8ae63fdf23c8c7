"""A real S3-compatible HTTP server on loopback (moto in server mode) for storage tests.

The server speaks the S3 REST protocol over HTTP on 127.0.0.1; clients reach it the
way users reach MinIO or any other S3-compatible store: ``AWS_ENDPOINT_URL`` plus
credentials from the standard AWS environment variables (fake ones here).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class S3Server:
    endpoint_url: str
    key: str
    secret: str

    def env(self) -> dict[str, str]:
        """What a user would export to point s3fs/pyarrow at this store."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.key,
            "AWS_SECRET_ACCESS_KEY": self.secret,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def filesystem(self):
        """An s3fs filesystem for this server with explicit settings (no process env)."""
        import s3fs

        return s3fs.S3FileSystem(
            key=self.key, secret=self.secret, endpoint_url=self.endpoint_url,
            skip_instance_cache=True,
        )


@contextmanager
def moto_s3() -> Iterator[S3Server]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield S3Server(f"http://{host}:{port}", "longdoc-test-key", "secret-" + secrets.token_hex(12))
    finally:
        server.stop()
