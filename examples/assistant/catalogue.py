"""The shop's catalogue, and what the assistant's tools do with it: search it, put outfits
together (the article's "dapei"), try one on (its "chuan").

Plain data and functions, no I/O: the tools in ``app.py`` wrap them, and ``shop.py`` renders
the same items as the pages of the tiny local shop the crawler reads.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CATALOGUE",
    "KINDS",
    "SEASONS",
    "Item",
    "by_id",
    "propose_outfits",
    "search_items",
    "try_on",
]


@dataclass(frozen=True)
class Item:
    """One article of clothing the shop sells."""

    id: str
    name: str
    kind: str  #: one of KINDS
    colour: str
    style: str  #: casual, smart or formal
    seasons: tuple[str, ...]
    price: int  #: euros
    material: str  #: shown on the product page only (the crawler reads it there)
    sizes: str  #: idem

    def summary(self) -> dict[str, Any]:
        """What a search shows of the item (material and sizes are on its page)."""
        return {
            "id": self.id,
            "name": self.name,
            "kind": self.kind,
            "colour": self.colour,
            "style": self.style,
            "seasons": list(self.seasons),
            "price_eur": self.price,
        }


#: top, bottom, shoes, outerwear: the shop's categories
KINDS = ("top", "bottom", "shoes", "outerwear")
SEASONS = ("spring", "summer", "autumn", "winter")

CATALOGUE: tuple[Item, ...] = (
    Item(
        "linen-shirt",
        "Linen shirt",
        "top",
        "white",
        "casual",
        ("spring", "summer"),
        39,
        "100% linen",
        "S, M, L, XL",
    ),
    Item(
        "striped-tee",
        "Striped T-shirt",
        "top",
        "navy and white",
        "casual",
        ("spring", "summer"),
        19,
        "organic cotton jersey",
        "XS to XXL",
    ),
    Item(
        "oxford-shirt",
        "Oxford shirt",
        "top",
        "light blue",
        "smart",
        ("spring", "autumn"),
        45,
        "cotton oxford",
        "S to XL",
    ),
    Item(
        "merino-sweater",
        "Merino sweater",
        "top",
        "grey",
        "smart",
        ("autumn", "winter"),
        69,
        "merino wool",
        "S to XL",
    ),
    Item(
        "beige-chinos",
        "Beige chinos",
        "bottom",
        "beige",
        "casual",
        ("spring", "summer", "autumn"),
        49,
        "cotton twill with 2% elastane",
        "waist 28 to 38",
    ),
    Item(
        "straight-jeans",
        "Straight jeans",
        "bottom",
        "mid blue",
        "casual",
        SEASONS,
        59,
        "rigid denim",
        "waist 28 to 40",
    ),
    Item(
        "wool-trousers",
        "Wool trousers",
        "bottom",
        "charcoal",
        "formal",
        ("autumn", "winter"),
        89,
        "wool flannel",
        "waist 30 to 40",
    ),
    Item(
        "canvas-sneakers",
        "White canvas sneakers",
        "shoes",
        "white",
        "casual",
        ("spring", "summer"),
        45,
        "canvas, rubber sole",
        "EU 36 to 46",
    ),
    Item(
        "suede-loafers",
        "Suede loafers",
        "shoes",
        "tan",
        "smart",
        ("spring", "summer", "autumn"),
        95,
        "suede, leather sole",
        "EU 39 to 46",
    ),
    Item(
        "leather-boots",
        "Leather boots",
        "shoes",
        "dark brown",
        "casual",
        ("autumn", "winter"),
        129,
        "leather, rubber sole",
        "EU 39 to 46",
    ),
    Item(
        "denim-jacket",
        "Denim jacket",
        "outerwear",
        "light blue",
        "casual",
        ("spring", "autumn"),
        69,
        "cotton denim",
        "S to XL",
    ),
    Item(
        "trench-coat",
        "Trench coat",
        "outerwear",
        "sand",
        "smart",
        ("spring", "autumn"),
        149,
        "cotton gabardine",
        "S to XL",
    ),
)

_BY_ID = {item.id: item for item in CATALOGUE}
_SYNONYMS = {  # words a shopper uses for a kind
    "top": ("top", "tops", "shirt", "shirts", "tee", "t-shirt", "sweater", "blouse"),
    "bottom": ("bottom", "bottoms", "trousers", "pants", "jeans", "chinos"),
    "shoes": ("shoes", "sneakers", "trainers", "loafers", "boots"),
    "outerwear": ("outerwear", "jacket", "coat"),
}
_WORD = re.compile(r"[a-z0-9-]+")


def by_id(item_id: str) -> Item:
    """The item ``item_id``; ``ValueError`` naming the known ids when there is none."""
    found = _BY_ID.get(item_id)
    if found is None:
        raise ValueError(
            f"there is no item {item_id[:60]!r} in the catalogue; its ids are: {', '.join(_BY_ID)}"
        )
    return found


def search_items(query: str, kind: str | None = None, limit: int = 5) -> list[Item]:
    """The items that match most words of ``query`` (name, colour, style, seasons, kind),
    best first, cheaper first among equals; only of ``kind`` when given."""
    if kind is not None and kind not in KINDS:
        raise ValueError(f"kind {kind[:40]!r} is not one of {', '.join(KINDS)}")
    words = set(_WORD.findall(query.lower()))
    scored = []
    for item in CATALOGUE:
        if kind is not None and item.kind != kind:
            continue
        text = set(_WORD.findall(f"{item.name} {item.colour} {item.style} {' '.join(item.seasons)}".lower()))
        text.update(_SYNONYMS[item.kind])
        score = len(words & text)
        if score or not words:
            scored.append((-score, item.price, item))
    return [item for *_, item in sorted(scored, key=lambda s: (s[0], s[1]))][:limit]


def _outfit_id(items: Sequence[Item]) -> str:
    return "+".join(item.id for item in items)


def _look(items: Sequence[Item]) -> str:
    names = [item.name for item in items]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def propose_outfits(item_ids: Sequence[str], limit: int = 3) -> list[dict[str, Any]]:
    """Up to ``limit`` outfits from the given items: each top with each bottom (in the
    order given), with the first shoes and the first outerwear given, if any."""
    items = [by_id(i) for i in dict.fromkeys(item_ids)]
    kinds = {k: [i for i in items if i.kind == k] for k in KINDS}
    if not kinds["top"] or not kinds["bottom"]:
        raise ValueError(
            "an outfit needs at least one top and one bottom: give their ids (search finds them)"
        )
    extras = [kinds[k][0] for k in ("shoes", "outerwear") if kinds[k]]
    outfits = []
    for top, bottom in itertools.islice(itertools.product(kinds["top"], kinds["bottom"]), limit):
        parts = [top, bottom, *extras]
        outfits.append(
            {"id": _outfit_id(parts), "look": _look(parts), "price_eur": sum(p.price for p in parts)}
        )
    return outfits


def try_on(outfit_id: str) -> str:
    """What putting on outfit ``outfit_id`` (item ids joined by ``+``) looks like."""
    ids = [i.strip() for i in outfit_id.split("+") if i.strip()]
    if not ids:
        raise ValueError("an outfit id is item ids joined by '+', as dapei proposes them")
    items = [by_id(i) for i in ids]
    worn = ", ".join(f"{item.name} ({item.kind})" for item in items)
    return f"Now wearing: {worn}. Total {sum(i.price for i in items)} EUR."
