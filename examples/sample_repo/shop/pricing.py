"""Discounts and sales tax. All amounts are Decimals rounded to cents."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

from .models import Customer, OrderLine

CENT = Decimal("0.01")
MEMBER_DISCOUNT = Decimal("0.05")
BULK_QUANTITY = 10
BULK_DISCOUNT = Decimal("0.10")
TAX_RATES = {"US": Decimal("0.07"), "DE": Decimal("0.19"), "FR": Decimal("0.20")}


def round_money(amount: Decimal) -> Decimal:
    return amount.quantize(CENT, rounding=ROUND_HALF_UP)


def line_discount(line: OrderLine) -> Decimal:
    """Bulk discount: 10% off a line of at least ``BULK_QUANTITY`` units."""
    if line.quantity >= BULK_QUANTITY:
        return round_money(line.subtotal * BULK_DISCOUNT)
    return Decimal("0")


def apply_discounts(lines: list[OrderLine], customer: Customer) -> Decimal:
    """The subtotal after bulk discounts and, for members, the member discount."""
    total = sum((line.subtotal - line_discount(line) for line in lines), Decimal("0"))
    if customer.is_member:
        total -= total * MEMBER_DISCOUNT
    return round_money(total)


def tax_for(amount: Decimal, lines: list[OrderLine], customer: Customer) -> Decimal:
    """Sales tax on the taxable share of ``amount``, at the customer's country rate."""
    rate = TAX_RATES.get(customer.country, Decimal("0"))
    gross = sum((line.subtotal for line in lines), Decimal("0"))
    if not gross:
        return Decimal("0")
    taxable = sum((line.subtotal for line in lines if line.product.taxable), Decimal("0"))
    return round_money(amount * taxable / gross * rate)
