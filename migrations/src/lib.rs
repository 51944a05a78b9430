//! Migrations of kiln's metadata database. They run unchanged on SQLite (the embedded default)
//! and on Postgres, and are numbered and append-only: a released migration is never edited.
//! `api` applies them at start; the other services wait until the schema is current.

pub use sea_orm_migration::MigratorTrait;
use sea_orm_migration::prelude::*;

mod columns;
mod m0001_initial;
mod m0002_images_and_datasets;
mod m0003_batches;
mod m0004_scheduling;
mod m0005_weights;
mod m0006_submit_keys;
mod m0007_requested_pools;
mod m0008_batch_stalls;
mod m0009_tenancy;
mod m0010_run_tracking;
mod m0011_models;
mod m0012_sweeps;
mod m0013_gpu_time;
mod m0014_services;
mod m0015_service_rollouts;
mod m0016_project_scoped_names;
mod m0017_controller_pauses;
mod m0018_pending_logins;
mod m0019_project_scoped_models;
mod m0020_cloud_provisioning;
mod m0021_outputs_sync;
mod m0022_disk_and_shm;
mod m0023_gangs;
mod m0024_job_nodes_by_heartbeat;
mod m0025_item_retries_and_usage;
mod m0026_batch_counts;
mod m0027_jobs_by_runner;
mod m0028_jobs_unpublished;

/// Migrator lists every migration in order.
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(m0001_initial::Migration),
            Box::new(m0002_images_and_datasets::Migration),
            Box::new(m0003_batches::Migration),
            Box::new(m0004_scheduling::Migration),
            Box::new(m0005_weights::Migration),
            Box::new(m0006_submit_keys::Migration),
            Box::new(m0007_requested_pools::Migration),
            Box::new(m0008_batch_stalls::Migration),
            Box::new(m0009_tenancy::Migration),
            Box::new(m0010_run_tracking::Migration),
            Box::new(m0011_models::Migration),
            Box::new(m0012_sweeps::Migration),
            Box::new(m0013_gpu_time::Migration),
            Box::new(m0014_services::Migration),
            Box::new(m0015_service_rollouts::Migration),
            Box::new(m0016_project_scoped_names::Migration),
            Box::new(m0017_controller_pauses::Migration),
            Box::new(m0018_pending_logins::Migration),
            Box::new(m0019_project_scoped_models::Migration),
            Box::new(m0020_cloud_provisioning::Migration),
            Box::new(m0021_outputs_sync::Migration),
            Box::new(m0022_disk_and_shm::Migration),
            Box::new(m0023_gangs::Migration),
            Box::new(m0024_job_nodes_by_heartbeat::Migration),
            Box::new(m0025_item_retries_and_usage::Migration),
            Box::new(m0026_batch_counts::Migration),
            Box::new(m0027_jobs_by_runner::Migration),
            Box::new(m0028_jobs_unpublished::Migration),
        ]
    }
}
