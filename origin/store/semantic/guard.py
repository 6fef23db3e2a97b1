"""What a cosine score cannot see, checked on the two texts themselves.

A sentence embedding is close to a bag of words: "convert 5 km to miles" and "convert
5 miles to km" score 0.99 with all-MiniLM-L6-v2, and "what is 12 times 7" is close to
"what is 12 times 8". So a candidate above the threshold must also agree with the
question on what reverses or changes an answer:

- the same numbers, in the same order, and the same symbol-bearing names ("C++" is not
  "C#", though both read as "c" to the model's tokenizer);
- the same symbols, punctuation aside ("2+2" is not "2*2", "$" is not "€"), which the
  model weighs little;
- the same negations (a "not" on one side only flips the question);
- no two words both use trade places around a word both put between them ("is Paris
  bigger than London" is not "is London bigger than Paris");
- no word on one side meets its opposite on the other: a list of common opposites
  ("advantages"/"disadvantages", "upload"/"download") and negating prefixes ("hide"/
  "unhide", "enable"/"disable");
- the same reason, place and object questions ("why", "where", "whom": "who taught
  Aristotle" is not "whom did Aristotle teach"), and the same tense (an "is" question
  is not a "was" question).

Each check can only turn a hit into a miss. ``judged`` then weighs the score by the
words the two texts share (``LEXICAL_WEIGHT``): a pair whose content words differ and
still scores high says the same in other words, while a high score from mostly shared
words is what template questions differing in one name or detail get ("rehab centers
near Greene County" / "near Johnson County"). Measured on the labelled pairs, this finds
more paraphrases at the same rate of wrong hits (docs/architecture.md, the semantic
cache).
"""

from __future__ import annotations

import re

__all__ = ["LEXICAL_WEIGHT", "MAX_LEXICAL_BOOST", "agree", "judged", "words"]

_WORD = re.compile(r"\d+(?:[.,]\d+)*|[^\W_]+(?:'[^\W_]+)?[+#]*")
_NUMBER = re.compile(r"\d")
_NEGATIONS = frozenset(
    {"not", "no", "never", "none", "nobody", "nothing", "neither", "nor", "without", "cannot"}
)
# Words too common to say anything about order ("the", "of"...): they move freely
# between paraphrases ("the capital of France" / "France's capital").
_FILLER_WORDS = (
    "an the of to in on at for by with from is are was were be been am do does did "
    "what what's whats which who whose how why when where i me my you your we our "
    "it its it's this that these those there here and or but if so as please can could "
    "would should will shall may might must tell give show explain let let's about"
)
_FILLER = frozenset(_FILLER_WORDS.split())
_OPPOSITE_PAIRS = (
    "for/against pros/cons advantages/disadvantages advantage/disadvantage benefits/drawbacks "
    "rise/set sunrise/sunset raise/lower increase/decrease increase/reduce push/pull "
    "import/export upload/download maximum/minimum max/min largest/smallest "
    "biggest/smallest big/small large/small hottest/coldest hot/cold warm/cold first/last "
    "oldest/newest oldest/youngest old/new old/young add/remove add/delete create/delete "
    "start/stop start/end begin/end open/close before/after buy/sell gain/lose win/lose "
    "high/low higher/lower highest/lowest most/least more/less more/fewer best/worst "
    "better/worse above/below up/down positive/negative true/false left/right north/south "
    "east/west on/off input/output send/receive encode/decode encrypt/decrypt allow/deny "
    "accept/reject include/exclude inside/outside long/short longest/shortest fast/slow "
    "faster/slower fastest/slowest good/bad easy/hard easiest/hardest strong/weak "
    "safe/dangerous rich/poor richest/poorest love/hate like/dislike agree/disagree "
    "lend/borrow give/take morning/evening day/night summer/winter male/female men/women "
    "early/late earliest/latest past/future ancient/modern attach/detach show/hide "
    "expand/collapse enable/disable connect/disconnect mount/unmount lock/unlock "
    "install/uninstall compress/decompress zip/unzip hide/unhide "
    "cheap/expensive cheapest/priciest heavy/light heaviest/lightest deep/shallow "
    "deepest/shallowest wide/narrow thick/thin wet/dry full/empty light/dark "
    "inhale/exhale arrive/depart arrival/departure debit/credit"
)
_OPPOSITES = frozenset(frozenset(pair.split("/")) for pair in _OPPOSITE_PAIRS.split())
_NEGATING_PREFIXES = ("un", "dis", "de", "non", "in", "im", "ir", "il", "anti")
_QUESTION_KINDS = frozenset({"why", "where", "whom"})  # "whom" asks for the object
_PAST = frozenset({"was", "were", "did", "had"})
_PRESENT = frozenset({"is", "are", "am", "do", "does", "has", "have"})


# Punctuation that phrasing moves around freely; every other character that is neither a
# letter, a digit nor a space is a symbol that must be on both sides.
_PUNCTUATION = frozenset("?.!,;:'\"()[]-\u2018\u2019\u201c\u201d\u2013\u2014\u00bf\u00a1")
_SYMBOL_CHARS = re.compile(r"[^\w\s]")


def _symbols(text: str) -> list[str]:
    return sorted(c for c in _SYMBOL_CHARS.findall(text) if c not in _PUNCTUATION)


def words(text: str) -> list[str]:
    """Lower-cased words and numbers, contractions split off ("isn't" -> "is", "not")."""
    out: list[str] = []
    for token in _WORD.findall(text.lower().replace("\u2019", "'")):
        if token.endswith("n't"):
            stem = token[:-3]
            out.extend(("can" if stem == "ca" else "will" if stem == "wo" else stem, "not"))
        elif token.endswith("'s") or token.endswith("'re") or token.endswith("'ve"):
            out.append(token.split("'")[0])
        else:
            out.append(token)
    return out


def _first_positions(ws: list[str], common: set[str]) -> dict[str, int]:
    found: dict[str, int] = {}
    for index, w in enumerate(ws):
        if w in common and w not in found:
            found[w] = index
    return found


def _swapped(a: list[str], b: list[str]) -> bool:
    """Two content words both texts use trade places around a word both put between
    them ("km to miles" / "miles to km"). A phrase that only moves as a block ("reverse
    a list in Python" / "Python: how to reverse a list") keeps nothing between."""
    common = {w for w in a if w not in _FILLER} & {w for w in b if w not in _FILLER}
    if len(common) < 2:
        return False
    in_a, in_b = _first_positions(a, common), _first_positions(b, common)
    ordered = sorted(common, key=in_a.__getitem__)
    for i, x in enumerate(ordered):
        for y in ordered[i + 1 :]:
            if in_b[y] < in_b[x]:  # x before y in the question, after it in the candidate
                between_a = set(a[in_a[x] + 1 : in_a[y]])
                between_b = set(b[in_b[y] + 1 : in_b[x]])
                if between_a & between_b:
                    return True
    return False


def _opposed(only_a: set[str], only_b: set[str]) -> bool:
    """A word only one text has meets its opposite, or itself with a negating prefix,
    among the words only the other has."""
    for x in only_a:
        for y in only_b:
            if frozenset((x, y)) in _OPPOSITES:
                return True
            longer, shorter = (x, y) if len(x) > len(y) else (y, x)
            if longer.endswith(shorter) and longer[: -len(shorter)] in _NEGATING_PREFIXES:
                return True
    return False


def _tense(ws: set[str]) -> str:
    return "past" if ws & _PAST else "present" if ws & _PRESENT else ""


_NAME = re.compile(r"(?<![.!?]\s)(?<!^)\b[A-Z][a-z]+(?:-[A-Z][a-z]+)*\b")


def _names(text: str) -> set[str]:
    """Capitalized words not opening a sentence ("Morgan", "Byzantine"): likely names."""
    return {m.group(0).lower() for m in _NAME.finditer(text.strip())}


def _other_name(a: str, b: str, words_a: set[str], words_b: set[str]) -> bool:
    """Each text names something the other does not mention at all: another entity
    ("near Morgan County" / "near Union County"), which a score barely sees."""
    bare_a = {w.rstrip("+#") for w in words_a}
    bare_b = {w.rstrip("+#") for w in words_b}
    # A name both texts use is not another's, even where the words split it otherwise
    # ("¹'Aa": the word "¹'aa", the name "aa"): a text never names another than itself.
    names_a, names_b = _names(a), _names(b)
    return bool(names_a - names_b - bare_b) and bool(names_b - names_a - bare_a)


# The judged score is the cosine plus LEXICAL_WEIGHT * (0.5 - the share of content words
# the texts have in common): from +0.03 (no word in common) to -0.03 (the same words).
LEXICAL_WEIGHT = 0.06
MAX_LEXICAL_BOOST = LEXICAL_WEIGHT / 2  # the most a score can gain: the index's shortlist bound


def agree(question: str, candidate: str) -> bool:
    """False when the texts differ in what a cosine score cannot see (module docstring)."""
    return _agree(question, candidate, words(question), words(candidate))


def judged(question: str, candidate: str, cosine: float) -> float | None:
    """The score a threshold is compared with: ``cosine`` weighed by the content words
    the texts share; None when the guard says they differ (``agree``)."""
    a, b = words(question), words(candidate)
    if not _agree(question, candidate, a, b):
        return None
    content_a = {w for w in a if w not in _FILLER}
    content_b = {w for w in b if w not in _FILLER}
    either = content_a | content_b
    shared = len(content_a & content_b) / len(either) if either else 1.0
    return cosine + LEXICAL_WEIGHT * (0.5 - shared)


def _agree(question: str, candidate: str, a: list[str], b: list[str]) -> bool:
    if [w for w in a if _NUMBER.search(w)] != [w for w in b if _NUMBER.search(w)]:
        return False
    if sorted(w for w in a if w in _NEGATIONS) != sorted(w for w in b if w in _NEGATIONS):
        return False
    if _symbols(question) != _symbols(candidate):
        return False
    set_a, set_b = set(a), set(b)
    if {w for w in set_a if w[-1] in "+#"} != {w for w in set_b if w[-1] in "+#"}:
        return False
    if set_a & _QUESTION_KINDS != set_b & _QUESTION_KINDS:
        return False
    tenses = {_tense(set_a), _tense(set_b)}
    if tenses == {"past", "present"}:
        return False
    if _opposed(set_a - set_b, set_b - set_a):
        return False
    if _other_name(question, candidate, set_a, set_b):
        return False
    return not _swapped(a, b)
