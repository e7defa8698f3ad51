-- Creates the MLflow tracking database next to the platform database.
-- Run by the postgres image (as POSTGRES_USER, who then owns it) only when the
-- data volume is initialised for the first time. For an existing volume:
--   docker compose exec postgres createdb -U rankops mlflow
SELECT 'CREATE DATABASE mlflow'
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'mlflow')\gexec
