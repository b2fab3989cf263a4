"""A tiny shop back end: products, stock, pricing and orders."""

from .inventory import Inventory, OutOfStockError
from .models import Customer, OrderLine, Product
from .orders import Order, place_order
from .pricing import apply_discounts, tax_for

__all__ = [
    "Customer",
    "Inventory",
    "Order",
    "OrderLine",
    "OutOfStockError",
    "Product",
    "apply_discounts",
    "place_order",
    "tax_for",
]
