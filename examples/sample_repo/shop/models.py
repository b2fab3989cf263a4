"""Plain data records shared by the rest of the package."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal


@dataclass(frozen=True)
class Product:
    """Something we sell, identified by its SKU."""

    sku: str
    name: str
    unit_price: Decimal
    category: str = "general"
    taxable: bool = True


@dataclass(frozen=True)
class Customer:
    """A buyer. Members get the member discount in ``pricing``."""

    customer_id: str
    name: str
    email: str
    is_member: bool = False
    country: str = "US"


@dataclass
class OrderLine:
    """One product in an order, with the quantity and the price at the time of the order."""

    product: Product
    quantity: int
    unit_price: Decimal = field(default=Decimal("0"))

    def __post_init__(self) -> None:
        if self.quantity <= 0:
            raise ValueError(f"quantity must be positive, got {self.quantity}")
        if not self.unit_price:
            self.unit_price = self.product.unit_price

    @property
    def subtotal(self) -> Decimal:
        return self.unit_price * self.quantity
