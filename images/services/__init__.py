"""Every change to registries and images, one module per sub-area; every one is audited.

Registries are called outside any database transaction: an import or a re-check asks the
registry first and then writes in one short transaction, so a slow registry never holds row
locks and a failed call leaves nothing half-saved. The one exception is resolving a tag at
submit time (`registries.tag_resolve`, called inside `jobs.services.run_submit`): it uses a
short timeout for that reason.

Import from the module itself (``from images.services.catalog import image_import``);
this package re-exports nothing."""
