"""Postings are append-only: on PostgreSQL a trigger refuses UPDATE and DELETE of ledger rows."""

from django.db import migrations

from core.migration_ops import postgresql_sql

CREATE = """
CREATE OR REPLACE FUNCTION billing_posting_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'billing_posting is append-only: post a correcting entry instead';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER billing_posting_append_only BEFORE UPDATE OR DELETE ON billing_posting
    FOR EACH ROW EXECUTE FUNCTION billing_posting_append_only();
"""
DROP = """
DROP TRIGGER IF EXISTS billing_posting_append_only ON billing_posting;
DROP FUNCTION IF EXISTS billing_posting_append_only();
"""


class Migration(migrations.Migration):
    dependencies = [("billing", "0003_ledger_accounts_rates")]
    operations = [postgresql_sql(CREATE, DROP)]
