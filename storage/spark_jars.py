"""Delta Lake's jars for the Apache Spark engine, pinned and cached.

Apache Spark's own jars ship in the pyspark wheel the project pins (4.2.x,
Spark Connect server included); Delta Lake's do not. They come from Maven
Central once, through the install step (``make install`` runs
``python -m wakustore.storage.spark_jars``), are checked against the
SHA-256 sums below and kept in the project's cache dir. A node never
downloads anything when it starts: :func:`installed` only looks.

Delta 4.x names its Spark connector after the Spark minor it was built
for (``delta-spark_4.2_2.13`` for Spark 4.2, Scala 2.13). Its Maven
dependencies that Spark's own jars already provide (Scala, Hadoop's
client, Parquet, Jackson, log4j, RoaringBitmap) are not fetched: a second
copy of another version on the class path is what breaks a JVM, and the
versions in the pyspark wheel are those Spark was built with. What is
left: Delta's connector, its storage layer, the Delta Kernel modules it
calls, and the Unity Catalog client classes its catalog code links to;
and for tables in buckets, Hadoop's S3A file system with the AWS SDK it
was built against.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

DELTA_VERSION = "4.4.0"
# The Spark minor Delta's connector was built for; pyspark 4.2.x is pinned.
SPARK_MINOR = "4.2"

MAVEN_REPOSITORY = "https://repo1.maven.org/maven2"
# A mirror (Artifactory, Nexus) may stand in for Maven Central.
MAVEN_REPOSITORY_ENV = "WAKUSTORE_MAVEN_REPOSITORY"
CACHE_DIR_ENV = "WAKUSTORE_CACHE_DIR"

# Between two reads of a download; a stalled one fails rather than waits.
DOWNLOAD_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Jar:
    group: str
    artifact: str
    version: str
    sha256: str

    @property
    def file_name(self) -> str:
        return f"{self.artifact}-{self.version}.jar"

    def url(self, repository: str) -> str:
        return f"{repository}/{self.group.replace('.', '/')}/{self.artifact}/{self.version}/{self.file_name}"


DELTA_JARS = (
    Jar(
        "io.delta",
        f"delta-spark_{SPARK_MINOR}_2.13",
        DELTA_VERSION,
        "27d4fd8b1f879535c573ed1c718177d6a27f24d3e626ba02e216369725721ead",
    ),
    Jar("io.delta", "delta-storage", DELTA_VERSION, "c46735481fa8e326b0957be02b4420cbcab4b325bb08009b7f2045a95133f1cc"),
    Jar(
        "io.delta",
        "delta-kernel-api",
        DELTA_VERSION,
        "ee9b5a14ac3b7efdff4d61a58478fe8eb0e5a3fbca43889dca7290795fe79a11",
    ),
    Jar(
        "io.delta",
        "delta-kernel-defaults",
        DELTA_VERSION,
        "225c975199e4718b38ee5b7e6da7f19e9585024262b2cec2656b32151a856b0b",
    ),
    Jar(
        "io.delta",
        "delta-kernel-unitycatalog",
        DELTA_VERSION,
        "cea22dfb4ac562b3cd27bf652697750e8336009d73fb06631363aaaad5345ffa",
    ),
    Jar(
        "io.unitycatalog",
        "unitycatalog-client",
        "0.6.0",
        "48257499a86b801a3e2372cec55ac226ca1c1c7eabe5c118e7302f29a1fdbc19",
    ),
    Jar(
        "io.unitycatalog",
        "unitycatalog-hadoop",
        "0.6.0",
        "c47b63c961c87102b9e1d63809a0915ba4c86b7652f57c8d39ca3a05b441a150",
    ),
)

# Tables in S3-compatible buckets (s3:// and s3a://): Hadoop's S3A file
# system of the Hadoop release in the pyspark wheel (3.5.0), and what it
# needs at run time: the AWS SDK v2 bundle it was built with (686 MB, one
# shaded jar) and its analytics accelerator. On the class path only for
# such tables: they made a local server's start 7 s slower and 100 MB larger.
S3_JARS = (
    Jar("org.apache.hadoop", "hadoop-aws", "3.5.0", "66bd9eefb938b1a1657487324b63c13df2d8b17164a1dd24e0ef37b905bc5baa"),
    Jar(
        "software.amazon.awssdk", "bundle", "2.35.4", "db4b55f24ad1b4e70f17eb1717a4de76a8dadc5a27d764be7c44ff67b2c1c677"
    ),
    Jar(
        "software.amazon.s3.analyticsaccelerator",
        "analyticsaccelerator-s3",
        "1.3.1",
        "4959a9747cbb479c73c3ffbcd479bee5b014f8b2880994585a8693fb9d24675e",
    ),
)

JARS = DELTA_JARS + S3_JARS


class JarsMissing(Exception):
    """Delta's jars are not in the cache: the install step has not run."""


def cache_dir() -> Path:
    """The project's cache dir: ``$WAKUSTORE_CACHE_DIR``, else inside the
    virtualenv wakustore runs from (``<venv>/cache/wakustore``: ``make
    install``'s ``.venv``, so one checkout's install serves its every
    command), else ``$XDG_CACHE_HOME/wakustore`` or ``~/.cache/wakustore``."""
    explicit = os.environ.get(CACHE_DIR_ENV)
    if explicit:
        return Path(explicit)
    if sys.prefix != sys.base_prefix:
        return Path(sys.prefix) / "cache" / "wakustore"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "wakustore"


def jars_dir(base: Path | None = None) -> Path:
    return (base or cache_dir()) / "spark-jars"


def installed(base: Path | None = None, s3: bool = False) -> list[Path]:
    """The paths of Delta's jars (with ``s3`` S3A's too), for the class
    path. Checks that each is present
    and that its install recorded the pinned digest (a ``.sha256`` file
    beside it) without hashing it again: a node's start reads no jars.
    Raises :class:`JarsMissing` naming the install command."""
    directory = jars_dir(base)
    paths = []
    for jar in DELTA_JARS + (S3_JARS if s3 else ()):
        path = directory / jar.file_name
        marker = path.with_name(path.name + ".sha256")
        try:
            recorded = marker.read_text().strip()
        except OSError:
            recorded = ""
        if not path.is_file() or recorded != jar.sha256:
            raise JarsMissing(
                f"the spark engine's jars (Delta Lake, S3A) are not in {directory}: "
                f"run `make install` or `python -m wakustore.storage.spark_jars` (fetches {len(JARS)} jars "
                "from Maven Central once)"
            )
        paths.append(path)
    return paths


def install(base: Path | None = None, repository: str | None = None, log=print) -> list[Path]:
    """Fetch every missing jar, check its SHA-256, and store it (written
    to a temporary name, then renamed). Idempotent; returns the paths."""
    repository = (repository or os.environ.get(MAVEN_REPOSITORY_ENV) or MAVEN_REPOSITORY).rstrip("/")
    directory = jars_dir(base)
    directory.mkdir(parents=True, exist_ok=True)
    for jar in JARS:
        path = directory / jar.file_name
        marker = path.with_name(path.name + ".sha256")
        if path.is_file() and _sha256(path) == jar.sha256:
            if not marker.is_file() or marker.read_text().strip() != jar.sha256:
                marker.write_text(jar.sha256 + "\n")
            continue
        url = jar.url(repository)
        log(f"fetching {url}")
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".fetch-", delete=False) as out:
            temporary = Path(out.name)
            try:
                with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
                    while chunk := response.read(1 << 20):
                        out.write(chunk)
            except BaseException:
                temporary.unlink(missing_ok=True)
                raise
        digest = _sha256(temporary)
        if digest != jar.sha256:
            temporary.unlink(missing_ok=True)
            raise RuntimeError(f"{url}: SHA-256 {digest} is not the pinned {jar.sha256}")
        os.replace(temporary, path)
        marker.write_text(jar.sha256 + "\n")
    return installed(base, s3=True)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as source:
        while chunk := source.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("-h", "--help"):
        print("usage: python -m wakustore.storage.spark_jars\n\nFetch Delta Lake's pinned jars into the cache dir.")
        return 0
    try:
        paths = install(log=lambda line: print(line, file=sys.stderr))
    except Exception as exc:  # one line for the install step
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{len(paths)} jars (Delta Lake {DELTA_VERSION}, S3A) in {jars_dir()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
