"""Orders: lines, totals, and placing an order against the inventory."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from decimal import Decimal

from .inventory import Inventory
from .models import Customer, OrderLine, Product
from .pricing import apply_discounts, round_money, tax_for

_order_ids = itertools.count(1)


@dataclass
class Order:
    """A customer's order. ``status`` goes "open" -> "placed" -> "shipped" (or "cancelled")."""

    customer: Customer
    lines: list[OrderLine] = field(default_factory=list)
    status: str = "open"
    order_id: int = field(default_factory=lambda: next(_order_ids))

    def add(self, product: Product, quantity: int = 1) -> OrderLine:
        """Add units of a product, merging with an existing line for the same SKU."""
        for line in self.lines:
            if line.product.sku == product.sku:
                line.quantity += quantity
                return line
        line = OrderLine(product, quantity)
        self.lines.append(line)
        return line

    @property
    def item_count(self) -> int:
        return sum(line.quantity for line in self.lines)

    def total(self) -> Decimal:
        """What the customer pays: discounted subtotal plus tax, rounded to cents."""
        discounted = apply_discounts(self.lines, self.customer)
        return round_money(discounted + tax_for(discounted, self.lines, self.customer))

    def cancel(self, inventory: Inventory) -> None:
        if self.status == "placed":
            inventory.release(self.lines)
        self.status = "cancelled"


def place_order(order: Order, inventory: Inventory) -> Decimal:
    """Reserve stock for every line and return the amount to charge."""
    if not order.lines:
        raise ValueError("cannot place an empty order")
    if order.status != "open":
        raise ValueError(f"order {order.order_id} is {order.status}")
    inventory.reserve(order.lines)
    order.status = "placed"
    return round_money(order.total())
