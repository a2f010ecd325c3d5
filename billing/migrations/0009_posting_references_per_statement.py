"""A posting's accounts and segment checked once per INSERT or COPY statement, not per row by foreign keys.

A foreign key checks and locks its target row once per inserted row (at commit, being deferred): for
a settlement's 150,000 postings that was 450,000 lookups, as long as writing the postings. On
PostgreSQL a statement-level trigger now looks the statement's new rows' accounts and segments up in
one query each, and refuses the statement (foreign_key_violation, an IntegrityError) if one is
missing. A foreign key also locks its target so that it cannot be deleted before the commit:
instead, accounts and meter segments are never deleted nor renumbered (a trigger refuses it; Django's
PROTECT already refused deleting them while postings named them, and wallets are never deleted).
"""

import django.db.models.deletion
from django.db import migrations, models

from core.migration_ops import postgresql_sql

CREATE = """
CREATE OR REPLACE FUNCTION billing_posting_references() RETURNS trigger AS $$
BEGIN
    IF EXISTS (
        SELECT 1 FROM (SELECT debit_id AS id FROM added UNION SELECT credit_id FROM added) named
        WHERE NOT EXISTS (SELECT 1 FROM billing_account a WHERE a.id = named.id)
    ) THEN
        RAISE EXCEPTION 'billing_posting names an account that does not exist' USING ERRCODE = 'foreign_key_violation';
    END IF;
    IF EXISTS (
        SELECT 1 FROM (SELECT DISTINCT segment_id AS id FROM added WHERE segment_id IS NOT NULL) named
        WHERE NOT EXISTS (SELECT 1 FROM billing_metersegment s WHERE s.id = named.id)
    ) THEN
        RAISE EXCEPTION 'billing_posting names a meter segment that does not exist'
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER billing_posting_references AFTER INSERT ON billing_posting REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION billing_posting_references();

CREATE OR REPLACE FUNCTION billing_kept() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION '% rows are kept: the ledger names them', TG_TABLE_NAME;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER billing_account_kept BEFORE DELETE OR UPDATE OF id ON billing_account
    FOR EACH ROW EXECUTE FUNCTION billing_kept();
CREATE TRIGGER billing_metersegment_kept BEFORE DELETE OR UPDATE OF id ON billing_metersegment
    FOR EACH ROW EXECUTE FUNCTION billing_kept();
"""
DROP = """
DROP TRIGGER IF EXISTS billing_posting_references ON billing_posting;
DROP FUNCTION IF EXISTS billing_posting_references();
DROP TRIGGER IF EXISTS billing_account_kept ON billing_account;
DROP TRIGGER IF EXISTS billing_metersegment_kept ON billing_metersegment;
DROP FUNCTION IF EXISTS billing_kept();
"""


class Migration(migrations.Migration):

    dependencies = [
        ('billing', '0008_top_up_permission'),
    ]

    operations = [
        migrations.AlterField(
            model_name='posting',
            name='credit',
            field=models.ForeignKey(db_constraint=False, on_delete=django.db.models.deletion.PROTECT, related_name='credits', to='billing.account'),
        ),
        migrations.AlterField(
            model_name='posting',
            name='debit',
            field=models.ForeignKey(db_constraint=False, on_delete=django.db.models.deletion.PROTECT, related_name='debits', to='billing.account'),
        ),
        migrations.AlterField(
            model_name='posting',
            name='segment',
            field=models.ForeignKey(blank=True, db_constraint=False, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='postings', to='billing.metersegment'),
        ),
        postgresql_sql(CREATE, DROP),
    ]
