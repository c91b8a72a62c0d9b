"""Every state change of tenants, their members, quotas and flavors, API tokens,
notifications and the audit log, one module per sub-area.

Import from the module itself (``from tenants.services.audit import audit_record``);
this package re-exports nothing."""
