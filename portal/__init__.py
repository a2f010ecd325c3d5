"""What users see as products: catalog, instances, console pages and the REST API."""
