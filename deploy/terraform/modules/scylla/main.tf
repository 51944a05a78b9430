# A ScyllaDB cluster (log-ingest's metric points and log lines) on fixed EC2 instances from
# ScyllaDB's own image, which sets up the instance's NVMe disks (RAID 0, XFS) and tunes itself on
# first boot from the JSON in its user data. Data lives on instance storage: it survives reboots,
# not a stop or a replacement, so keep the keyspace's replication factor at 3 and replace a lost
# node as a new one (Scylla streams its data back).
variable "name" {
  description = "Name prefix."
  type        = string
}

variable "private_ips" {
  description = "One address per node (from the address plan), spread over the AZs."
  type        = list(string)
}

variable "subnet_ids" {
  description = "Private subnets, one per AZ."
  type        = list(string)
}

variable "ami_id" {
  description = "A ScyllaDB image (the scylla-machine-image of the release to run)."
  type        = string
}

variable "instance_type" {
  description = "An instance type with NVMe instance storage (i4i, i3en, i7ie)."
  type        = string
}

variable "security_group_id" {
  description = "The Scylla security group."
  type        = string
}

variable "kms_key_arn" {
  description = "The key the root volumes are encrypted with."
  type        = string
}

module "role" {
  source = "../instance-role"
  name   = "${var.name}-scylla"
  # Scylla uses no AWS API: Session Manager only.
  policy_json = null
}

locals {
  # The first node of each AZ seeds the others.
  seeds = join(",", slice(var.private_ips, 0, min(length(var.subnet_ids), length(var.private_ips))))
  user_data = jsonencode({
    scylla_yaml = {
      cluster_name = "${var.name}-scylla"
      # Each AZ is a rack of the region's datacenter.
      endpoint_snitch = "Ec2Snitch"
      seed_provider = [{
        class_name = "org.apache.cassandra.locator.SimpleSeedProvider"
        parameters = [{ seeds = local.seeds }]
      }]
    }
    start_scylla_on_first_boot = true
  })
}

module "nodes" {
  source             = "../node"
  name               = "${var.name}-scylla"
  private_ips        = var.private_ips
  subnet_ids         = var.subnet_ids
  ami_id             = var.ami_id
  instance_type      = var.instance_type
  security_group_ids = [var.security_group_id]
  instance_profile   = module.role.profile_name
  kms_key_arn        = var.kms_key_arn
  root_volume_gb     = 40
  user_data          = [for ip in var.private_ips : local.user_data]
}

output "contact_points" {
  description = "host:port of every node's CQL port, for log-ingest's `[scylla] nodes`."
  value       = [for ip in var.private_ips : "${ip}:9042"]
}
