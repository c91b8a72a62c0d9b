"""Rate cards: as plain rates for pricing, the platform's currency, and every flavor's
history for the rate card page."""

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date

from finance import costing
from finance.models import RateCard
from tenants.models import GpuFlavor


def rate_cards_for(flavor_ids: Iterable[int]) -> dict[int, list[costing.Rate]]:
    """Each flavor's cards as plain rates."""
    rates: dict[int, list[costing.Rate]] = defaultdict(list)
    for card in RateCard.objects.filter(flavor_id__in=set(flavor_ids)):
        rates[card.flavor_id].append(
            costing.Rate(
                valid_from=costing.midnight(card.valid_from),
                valid_to=costing.midnight(card.valid_to) if card.valid_to else None,
                price_per_gpu_hour=card.price_per_gpu_hour,
                card_id=card.pk,
                credits=card.credit_policy == RateCard.CreditPolicy.CREDIT,
            )
        )
    return rates


def platform_currency() -> str | None:
    """The currency of the rate cards: one for the whole platform, so every statement
    adds up in one unit. None before the first card."""
    return RateCard.objects.order_by("pk").values_list("currency", flat=True).first()


@dataclass(frozen=True)
class FlavorRates:
    """A flavor's rate cards, the newest first, and the one in force on the day asked."""

    flavor: GpuFlavor
    cards: list[RateCard]
    current: RateCard | None


def rate_cards_by_flavor(*, today: date) -> list[FlavorRates]:
    """Every flavor, with or without cards: two queries."""
    cards: dict[int, list[RateCard]] = defaultdict(list)
    for card in RateCard.objects.select_related("created_by").order_by("flavor_id", "-valid_from"):
        cards[card.flavor_id].append(card)
    result = []
    for flavor in GpuFlavor.objects.order_by("slug"):
        history = cards.get(flavor.pk, [])
        current = next(
            (
                card
                for card in history
                if card.valid_from <= today and (card.valid_to is None or today < card.valid_to)
            ),
            None,
        )
        result.append(FlavorRates(flavor=flavor, cards=history, current=current))
    return result
