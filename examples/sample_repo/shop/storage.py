"""Saving and loading the catalog and stock levels as JSON."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

from .inventory import Inventory
from .models import Product


def save_catalog(products: list[Product], path: Path) -> None:
    rows = [
        {
            "sku": p.sku,
            "name": p.name,
            "unit_price": str(p.unit_price),
            "category": p.category,
            "taxable": p.taxable,
        }
        for p in products
    ]
    path.write_text(json.dumps(rows, indent=2))


def load_catalog(path: Path) -> dict[str, Product]:
    """Products by SKU."""
    rows = json.loads(path.read_text())
    return {
        row["sku"]: Product(
            sku=row["sku"],
            name=row["name"],
            unit_price=Decimal(row["unit_price"]),
            category=row.get("category", "general"),
            taxable=row.get("taxable", True),
        )
        for row in rows
    }


def save_inventory(inventory: Inventory, path: Path) -> None:
    path.write_text(json.dumps(inventory.snapshot(), indent=2, sort_keys=True))


def load_inventory(path: Path) -> Inventory:
    """Stock on hand from a snapshot; reservations are not restored."""
    inventory = Inventory()
    for sku, levels in json.loads(path.read_text()).items():
        if levels["on_hand"] > 0:
            inventory.add_stock(sku, levels["on_hand"])
    return inventory
