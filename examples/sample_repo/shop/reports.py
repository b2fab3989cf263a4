"""Summaries for the back office: revenue by category and what to restock."""

from __future__ import annotations

from collections import Counter
from decimal import Decimal

from .inventory import Inventory
from .orders import Order


def revenue_by_category(orders: list[Order]) -> dict[str, Decimal]:
    """Gross revenue of shipped orders per product category (before discounts and tax)."""
    revenue: dict[str, Decimal] = {}
    for order in orders:
        if order.status != "shipped":
            continue
        for line in order.lines:
            category = line.product.category
            revenue[category] = revenue.get(category, Decimal("0")) + line.subtotal
    return dict(sorted(revenue.items()))


def best_sellers(orders: list[Order], top: int = 3) -> list[tuple[str, int]]:
    """The SKUs with the most units in placed or shipped orders."""
    units: Counter[str] = Counter()
    for order in orders:
        if order.status in ("placed", "shipped"):
            for line in order.lines:
                units[line.product.sku] += line.quantity
    return units.most_common(top)


def restock_list(inventory: Inventory, threshold: int = 5) -> list[str]:
    """One line per low SKU: how many units to order to get back to twice the threshold."""
    lines = []
    for sku in inventory.low_stock(threshold):
        missing = 2 * threshold - inventory.available(sku)
        lines.append(f"{sku}: order {missing} units")
    return lines
