"""What users see as products: the catalog, instances, jobs and arrays (models.py), the logic and reads behind
them (services/, selectors/), and the three ways in: console pages, live sockets and the REST API."""
