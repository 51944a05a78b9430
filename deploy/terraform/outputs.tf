output "vpc_id" {
  description = "The VPC."
  value       = module.network.vpc_id
}

output "bucket" {
  description = "The kiln bucket: upload the release to s3://BUCKET/releases/VERSION/."
  value       = module.objects.bucket
}

output "objects_url" {
  description = "kiln's objects.url."
  value       = "s3://${module.objects.bucket}/${var.objects_prefix}"
}

output "release_url" {
  description = "Where the instances fetch the kiln binaries at boot."
  value       = "s3://${module.objects.bucket}/${local.release_prefix}/"
}

output "database_address" {
  description = "The RDS Postgres host."
  value       = module.postgres.address
}

output "database_secret_arn" {
  description = "The Secrets Manager secret RDS keeps the master password in."
  value       = module.postgres.master_user_secret_arn
}

output "nats_urls" {
  description = "kiln's nats.url."
  value       = module.nats.urls
}

output "scylla_contact_points" {
  description = "log-ingest's scylla.nodes."
  value       = module.scylla.contact_points
}

output "api_url" {
  description = "The api, for KILN_ADDR inside the VPC."
  value       = "http://api.${var.private_zone}:7070"
}

output "advisor_urls" {
  description = "The advisor replicas' gRPC addresses (each one's advertise-url); advisor.ZONE names them all, for KILN_ADVISOR_ADDR (`kiln sweep`)."
  value       = module.services.advisor_urls
}

output "predictor_urls" {
  description = "The predictor replicas' gRPC addresses; predictor.ZONE:7077 names them all, for KILN_PREDICTOR_ADDR (`kiln serve`)."
  value       = module.services.predictor_urls
}

output "predictor_http_url" {
  description = "The predictor's REST API (the Open Inference Protocol over HTTP), every replica by name: its http-advertise-url."
  value       = "http://predictor.${var.private_zone}:7078"
}

output "addresses" {
  description = "The address plan: each node set's private addresses."
  value       = local.ips
}

output "service_instance_ids" {
  description = "Instance ids of each service's replicas (the api's admin token is in /var/lib/kiln/api/admin.token on the first)."
  value       = module.services.instance_ids
}

output "cluster" {
  description = "The kiln cluster id: provisioner.toml's `cluster`, and the kiln-cluster tag on every runner instance the provisioner launches."
  value       = local.cluster
}

output "runner_launch_templates" {
  description = "Each runner pool's launch template, by name (provisioner.toml's `launch-template`; the provisioner launches its $Default version)."
  value       = { for pool, m in module.runner_pool : pool => m.launch_template_name }
}

output "runner_placement_groups" {
  description = "The cluster placement group of each runner pool with cluster_placement, by name (provisioner.toml's `placement-group`): its gangs launch into it."
  value       = { for pool, m in module.runner_pool : pool => m.placement_group_name if m.placement_group_name != null }
}

output "provisioner_role_arn" {
  description = "kiln-provisioner's IAM role: the only one that may launch and terminate the cluster's runners."
  value       = module.services.role_arns["provisioner"]
}

output "kms_key_arn" {
  description = "The kiln key: put-nats-seeds.sh encrypts the services' NATS seeds with it."
  value       = module.kms.arn
}

output "nats_seed_parameters" {
  description = "Where each service's NATS NKey seed is read from (SSM Parameter Store, SecureString)."
  value       = "${local.nats_seed_prefix}/<service>"
}
