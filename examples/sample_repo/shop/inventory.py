"""Stock levels per SKU, with reservations for orders that are not shipped yet."""

from __future__ import annotations

from collections import defaultdict

from .models import OrderLine


class OutOfStockError(Exception):
    """Raised when an order asks for more units than are available."""

    def __init__(self, sku: str, requested: int, available: int) -> None:
        super().__init__(f"{sku}: requested {requested}, only {available} available")
        self.sku = sku
        self.requested = requested
        self.available = available


class Inventory:
    """Units on hand and units reserved, per SKU."""

    def __init__(self) -> None:
        self._on_hand: dict[str, int] = defaultdict(int)
        self._reserved: dict[str, int] = defaultdict(int)

    def add_stock(self, sku: str, quantity: int) -> None:
        if quantity <= 0:
            raise ValueError("quantity must be positive")
        self._on_hand[sku] += quantity

    def available(self, sku: str) -> int:
        """Units that can still be sold: on hand minus reserved."""
        return self._on_hand[sku] - self._reserved[sku]

    def reserve(self, lines: list[OrderLine]) -> None:
        """Reserve every line of an order, or none of them."""
        for line in lines:
            if self.available(line.product.sku) < line.quantity:
                raise OutOfStockError(line.product.sku, line.quantity, self.available(line.product.sku))
        for line in lines:
            self._reserved[line.product.sku] += line.quantity

    def release(self, lines: list[OrderLine]) -> None:
        """Give back the units of a cancelled order."""
        for line in lines:
            self._reserved[line.product.sku] -= line.quantity

    def ship(self, lines: list[OrderLine]) -> None:
        """Reserved units leave the warehouse."""
        for line in lines:
            self._reserved[line.product.sku] -= line.quantity
            self._on_hand[line.product.sku] -= line.quantity

    def low_stock(self, threshold: int = 5) -> list[str]:
        """SKUs with fewer than ``threshold`` units available, sorted."""
        return sorted(sku for sku in self._on_hand if self.available(sku) < threshold)

    def snapshot(self) -> dict[str, dict[str, int]]:
        return {
            sku: {"on_hand": self._on_hand[sku], "reserved": self._reserved[sku]} for sku in self._on_hand
        }
