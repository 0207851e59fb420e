"""The three-domain real-text corpus (code, biology, prose) for paper B, fetched offline and split.

Paper B pre-trains its substrate on "a mixed corpus" with domains "such as code, biology and general
prose" and names no source. We use real text a fresh Debian/Ubuntu machine gets without a model hub:

| domain  | source                                                           | licence      |
|---------|------------------------------------------------------------------|--------------|
| code    | the CPython standard library of the running interpreter (*.py)    | PSF-2.0      |
| biology | Debian ``emboss-data``: Gene Ontology (go.obo, CC-BY-3.0) and     | CC-BY-3.0/PD |
|         | Sequence Ontology (so.obo, public domain) term names + definitions |              |
| prose   | Debian ``python3.11-doc`` tutorial/howto/faq (PSF-2.0) and         | PSF-2.0,     |
|         | ``debian-reference-en`` (GPL-2+)                                  | GPL-2+       |

``eco.obo`` (GPL-3+) and ``fortunes`` (unclear copyright) are left out. Packages are fetched with
``apt-get download`` + ``dpkg-deb -x`` (no install, no root) into ``data/downloads/molora/``.
The SMOKE profile never touches apt: it reads the small committed sample in ``data/molora_sample/``
(same sources, same cleaning; see its SOURCES.md).

A *document* is the unit of splitting: one source file (code, a Python-docs page), a block of 40
consecutive ontology terms, or a ~8 KB block of the Debian reference. Splits are explicit lists of
document ids, assigned by a seeded hash of the id, disjoint (checked), saved with the corpus.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from copes_lib.config import REPO_ROOT, ConfigError

DOMAINS = ("code", "biology", "prose")
SPLITS = ("train", "val", "test")
DOWNLOAD_DIR = REPO_ROOT / "data" / "downloads" / "molora"
SAMPLE_DIR = REPO_ROOT / "data" / "molora_sample"
# package -> the paths inside it that the corpus reads (only these are unpacked)
DEBIAN_PACKAGES = {
    "emboss-data": ("usr/share/EMBOSS/data/OBO/go.obo", "usr/share/EMBOSS/data/OBO/so.obo",
                    "usr/share/doc/emboss-data/copyright"),
    "python3.11-doc": ("usr/share/doc/python3.11/html/_sources/tutorial/", "usr/share/doc/python3.11/html/_sources/howto/",
                       "usr/share/doc/python3.11/html/_sources/faq/", "usr/share/doc/python3.11-doc/copyright"),
    "debian-reference-en": ("usr/share/debian-reference/debian-reference.en.txt.gz",
                            "usr/share/doc/debian-reference-en/copyright"),
}

SOURCES = {
    "code": "CPython standard library sources of the running interpreter (PSF-2.0)",
    "biology": "Gene Ontology go.obo (CC-BY-3.0) and Sequence Ontology so.obo (public domain), "
               "term names and definitions, from Debian emboss-data",
    "prose": "Python 3.11 documentation tutorial/howto/faq (PSF-2.0, Debian python3.11-doc) and the "
             "Debian Reference (GPL-2+, Debian debian-reference-en)",
}


@dataclasses.dataclass(frozen=True)
class Document:
    id: str
    domain: str
    text: str


# --------------------------------------------------------------------------- fetching
def _apt_download(package: str, dest: Path) -> list[Path]:
    """``apt-get download`` into ``dest``; on a fresh machine (empty package lists) update them once, as root."""
    if shutil.which("apt-get") is None:
        raise RuntimeError(
            f"apt-get not found: the cpu/gpu corpus needs Debian package {package!r}. Put {package}_*.deb "
            f"into {dest} by hand, or run PROFILE=smoke (the committed sample).")
    result = subprocess.run(["apt-get", "download", package], cwd=dest, capture_output=True, text=True)
    if result.returncode != 0 and hasattr(os, "geteuid") and os.geteuid() == 0:
        subprocess.run(["apt-get", "update"], capture_output=True, text=True)
        result = subprocess.run(["apt-get", "download", package], cwd=dest, capture_output=True, text=True)
    debs = sorted(dest.glob(f"{package}_*.deb"))
    if not debs:
        raise RuntimeError(f"apt-get download {package} failed (run `apt-get update` first?):\n{result.stderr[-2000:]}")
    return debs


def _unpack(deb: Path, root: Path, wanted: tuple[str, ...]) -> None:
    """Extract only the ``wanted`` paths (files or folder prefixes) of a .deb's data archive into ``root``."""
    import tarfile

    stream = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(stream)) as tar:
        members = [m for m in tar.getmembers() if m.isfile()
                   and any(m.name.lstrip("./").startswith(w) for w in wanted)]
        tar.extractall(root, members=members, filter="data")


def fetch_debian_packages(packages: dict = DEBIAN_PACKAGES, dest: Path = DOWNLOAD_DIR) -> Path:
    """Download each package's .deb into ``dest`` and unpack the paths the corpus reads (cached; no install)."""
    dest.mkdir(parents=True, exist_ok=True)
    root = dest / "root"
    for package, wanted in packages.items():
        marker = dest / f".{package}.unpacked"
        if marker.exists():
            continue
        debs = sorted(dest.glob(f"{package}_*.deb")) or _apt_download(package, dest)
        root.mkdir(exist_ok=True)
        _unpack(debs[-1], root, wanted)
        marker.write_text(debs[-1].name + "\n")
    return root


# --------------------------------------------------------------------------- cleaning
def clean_text(text: str) -> str:
    """Drop control characters, normalise line ends, trailing spaces and runs of blank lines."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\t", "    ")
    text = "".join(ch for ch in text if ch == "\n" or ch.isprintable())
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


def code_documents(stdlib: Path | None = None) -> list[Document]:
    """One document per stdlib ``.py`` file, skipping tests, site-packages and vendored trees."""
    stdlib = Path(stdlib or Path(os.__file__).parent)
    skip = {"test", "tests", "site-packages", "idlelib", "lib2to3", "turtledemo", "__pycache__", "ensurepip"}
    docs = []
    for path in sorted(stdlib.rglob("*.py")):
        rel = path.relative_to(stdlib)
        if skip & set(rel.parts):
            continue
        text = clean_text(path.read_text(encoding="utf-8", errors="replace"))
        if len(text) > 200:
            docs.append(Document(f"code:{rel.as_posix()}", "code", text))
    return docs


def obo_terms(path: Path) -> list[str]:
    """``name: definition`` lines of the non-obsolete [Term] stanzas of an OBO file."""
    terms, name, definition, obsolete = [], None, None, False
    for line in path.read_text(encoding="utf-8", errors="replace").split("\n") + ["[Term]"]:
        if line.startswith("["):
            if name and definition and not obsolete:
                terms.append(f"{name}: {definition}")
            name, definition, obsolete = None, None, False
        elif line.startswith("name: "):
            name = line[6:].strip()
        elif line.startswith("def: "):
            match = re.match(r'def: "(.*)"', line)  # drop the [source refs] after the quoted text
            definition = match.group(1).replace('\\"', '"') if match else None
        elif line.startswith("is_obsolete: true"):
            obsolete = True
    return terms


def biology_documents(root: Path, terms_per_doc: int = 40) -> list[Document]:
    docs = []
    for name in ("go.obo", "so.obo"):
        terms = obo_terms(root / "usr/share/EMBOSS/data/OBO" / name)
        for start in range(0, len(terms), terms_per_doc):
            text = clean_text("\n".join(terms[start:start + terms_per_doc]))
            docs.append(Document(f"biology:{name}:{start // terms_per_doc:05d}", "biology", text))
    return docs


def _blocks(text: str, size: int = 8000) -> list[str]:
    """Cut ``text`` at blank lines into blocks of about ``size`` characters."""
    blocks, current = [], []
    for para in text.split("\n\n"):
        current.append(para)
        if sum(len(p) for p in current) >= size:
            blocks.append("\n\n".join(current))
            current = []
    if current:
        blocks.append("\n\n".join(current))
    return blocks


def prose_documents(root: Path) -> list[Document]:
    docs = []
    sources = root / "usr/share/doc/python3.11/html/_sources"
    for section in ("tutorial", "howto", "faq"):
        for path in sorted((sources / section).glob("*.rst.txt")):
            text = clean_text(path.read_text(encoding="utf-8", errors="replace"))
            if len(text) > 200:
                docs.append(Document(f"prose:pydoc/{section}/{path.name}", "prose", text))
    reference = root / "usr/share/debian-reference/debian-reference.en.txt.gz"
    text = clean_text(gzip.decompress(reference.read_bytes()).decode("utf-8", errors="replace"))
    for i, block in enumerate(_blocks(text)):
        docs.append(Document(f"prose:debian-reference:{i:04d}", "prose", clean_text(block)))
    return docs


# --------------------------------------------------------------------------- corpus
def _budgeted(docs: list[Document], max_chars: int, seed: int) -> list[Document]:
    """A seeded random subset of ``docs`` with at most ``max_chars`` characters (0 = all)."""
    order = sorted(docs, key=lambda d: hashlib.sha256(f"{seed}:pick:{d.id}".encode()).hexdigest())
    kept, total = [], 0
    for doc in order:
        if max_chars and total + len(doc.text) > max_chars:
            continue
        kept.append(doc)
        total += len(doc.text)
    return sorted(kept, key=lambda d: d.id)


def load_documents(source: str, max_chars_per_domain: int = 0, seed: int = 0) -> dict[str, list[Document]]:
    """Documents per domain. ``source``: "sample" (committed, offline) or "debian" (fetch + clean)."""
    if source == "sample":
        docs = {d: [] for d in DOMAINS}
        for domain in DOMAINS:
            for line in (SAMPLE_DIR / f"{domain}.jsonl").read_text().splitlines():
                row = json.loads(line)
                docs[domain].append(Document(row["id"], domain, row["text"]))
    elif source == "debian":
        root = fetch_debian_packages()
        docs = {"code": code_documents(), "biology": biology_documents(root), "prose": prose_documents(root)}
    else:
        raise ConfigError(f"corpus source = {source!r} is not valid; valid values: ['sample', 'debian']")
    return {d: _budgeted(docs[d], max_chars_per_domain, seed) for d in DOMAINS}


def split_ids(docs: dict[str, list[Document]], fractions=(0.8, 0.1, 0.1), seed: int = 0) -> dict:
    """{domain: {split: [doc ids]}} by a seeded hash of each id; every split of every domain non-empty."""
    if len(fractions) != 3 or abs(sum(fractions) - 1) > 1e-9 or min(fractions) <= 0:
        raise ConfigError(f"split fractions {fractions} must be three positive numbers summing to 1")
    out = {}
    for domain, items in docs.items():
        if len(items) < 3:
            raise ConfigError(f"domain {domain!r} has {len(items)} documents; at least 3 are needed to split")
        order = sorted(items, key=lambda d: hashlib.sha256(f"{seed}:split:{d.id}".encode()).hexdigest())
        n = len(order)
        n_val = max(1, round(fractions[1] * n))
        n_test = max(1, round(fractions[2] * n))
        ids = [d.id for d in order]
        out[domain] = {"train": sorted(ids[: n - n_val - n_test]),
                       "val": sorted(ids[n - n_val - n_test: n - n_test]),
                       "test": sorted(ids[n - n_test:])}
    check_splits(out)
    return out


def check_splits(splits: dict) -> None:
    """Raise ValueError unless the splits are disjoint within and across domains and non-empty."""
    seen: dict[str, str] = {}
    for domain, parts in splits.items():
        for split in SPLITS:
            if not parts.get(split):
                raise ValueError(f"split {domain}/{split} is empty")
            for doc_id in parts[split]:
                if doc_id in seen:
                    raise ValueError(f"document {doc_id!r} is in both {seen[doc_id]} and {domain}/{split}")
                seen[doc_id] = f"{domain}/{split}"


def corpus_stats(docs: dict[str, list[Document]], splits: dict) -> list[dict]:
    """Rows (domain, split, documents, characters) for the notebook's table."""
    by_id = {d.id: d for items in docs.values() for d in items}
    return [{"domain": domain, "split": split, "documents": len(splits[domain][split]),
             "characters": sum(len(by_id[i].text) for i in splits[domain][split])}
            for domain in splits for split in SPLITS]


def write_sample(docs: dict[str, list[Document]], chars_per_domain: int, out_dir: Path = SAMPLE_DIR,
                 seed: int = 0, exclude: tuple[str, ...] = ("debian-reference",)) -> None:
    """Write the committed smoke sample: a seeded subset of whole documents per domain as JSONL.

    The GPL-2+ Debian Reference is excluded so the committed sample is PSF-2.0 / CC-BY-3.0 / PD only.
    """
    from copes_lib.runs import atomic_write_text

    for domain in DOMAINS:
        pool = [d for d in docs[domain] if len(d.text) <= chars_per_domain // 6
                and not any(word in d.id for word in exclude)]
        kept = _budgeted(pool, chars_per_domain, seed)
        lines = [json.dumps({"id": d.id, "text": d.text}, ensure_ascii=False) for d in kept]
        atomic_write_text(out_dir / f"{domain}.jsonl", "\n".join(lines) + "\n")


if __name__ == "__main__":  # python -m copes_lib.molora.corpus sample 60000  -> rewrite the committed sample
    if sys.argv[1:2] == ["sample"]:
        write_sample(load_documents("debian"), int(sys.argv[2]))
