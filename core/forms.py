"""What every form of the portal shares."""

from django import forms
from django.core.exceptions import ValidationError


class ServiceErrorsMixin(forms.BaseForm):
    """Put first in the bases of a Form (``class F(ServiceErrorsMixin, forms.Form)``)."""

    def add_service_errors(self, error: ValidationError) -> None:
        """Show a service's errors next to the fields they name (the rest above the form)."""
        if not hasattr(error, "error_dict"):
            self.add_error(None, error.messages)
            return
        for name, messages in error.message_dict.items():
            self.add_error(name if name in self.fields else None, messages)
