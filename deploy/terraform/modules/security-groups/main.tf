# One security group per kind of instance, each opening only the ports kiln uses, and only to
# the instances that use them (or, for clients and metrics scrapers, to the given ranges inside
# the VPC). No SSH: operators reach instances through SSM Session Manager.
variable "name" {
  description = "Prefix of the groups' names."
  type        = string
}

variable "vpc_id" {
  description = "The VPC the groups belong to."
  type        = string
}

variable "vpc_cidr" {
  description = "The VPC's range (the egress to kiln's own ports stays inside it)."
  type        = string
}

variable "client_cidrs" {
  description = "Ranges inside the VPC (or peered to it) that users' `kiln` CLI and SDK connect from."
  type        = list(string)
}

variable "metrics_cidrs" {
  description = "Ranges a Prometheus scrapes the metrics ports from."
  type        = list(string)
}

locals {
  groups = {
    api         = "kiln-api: gRPC 7070, metrics 9470"
    scheduler   = "kiln-scheduler: gRPC 7073, metrics 9473"
    log_ingest  = "kiln-log-ingest: gRPC 7071, metrics 9471"
    item_batch  = "kiln-item-batch: gRPC 7075, metrics 9475"
    advisor     = "kiln-advisor: gRPC 7076, metrics 9476"
    predictor   = "kiln-predictor: gRPC 7077, HTTP 7078, metrics 9477"
    provisioner = "kiln-provisioner: gRPC 7072, metrics 9472"
    runner      = "kiln-runner: gRPC 7074, metrics 9474"
    nats        = "NATS: client 4222, cluster 6222, monitoring 8222"
    scylla      = "ScyllaDB: CQL 9042, inter-node 7000"
    postgres    = "RDS Postgres: 5432"
  }

  kiln = ["api", "scheduler", "log_ingest", "item_batch", "advisor", "predictor", "provisioner", "runner"]

  # Who may reach which port of which group, from another group.
  from_groups = concat(
    # Every kiln service and runner talks to NATS and Postgres.
    [for g in local.kiln : { to = "nats", port = 4222, from = g, what = "NATS clients" }],
    [for g in local.kiln : { to = "postgres", port = 5432, from = g, what = "Postgres clients" }],
    # kiln reads nats-server's /varz and its consumers' state from the monitoring port.
    [for g in local.kiln : { to = "nats", port = 8222, from = g, what = "NATS monitoring" }],
    [
      { to = "nats", port = 6222, from = "nats", what = "NATS cluster routes" },
      { to = "scylla", port = 7000, from = "scylla", what = "Scylla inter-node" },
      { to = "scylla", port = 9042, from = "log_ingest", what = "CQL from log-ingest" },
      # Jobs on runners report to the api, write metrics and logs to log-ingest; batch workers
      # take items from item-batch; sweeps' trials ask the advisor whether to stop.
      { to = "api", port = 7070, from = "runner", what = "jobs and runners to the api" },
      { to = "log_ingest", port = 7071, from = "runner", what = "jobs' metrics and logs" },
      { to = "item_batch", port = 7075, from = "runner", what = "batch workers" },
      { to = "advisor", port = 7076, from = "runner", what = "sweep trials (ShouldStop)" },
    ],
  )

  # Who may reach which port from address ranges.
  from_cidrs = concat(
    flatten([for cidr in var.client_cidrs : [
      { to = "api", port = 7070, cidr = cidr, what = "kiln CLI and SDK" },
      { to = "log_ingest", port = 7071, cidr = cidr, what = "kiln logs and metrics" },
      { to = "item_batch", port = 7075, cidr = cidr, what = "kiln batch" },
      { to = "advisor", port = 7076, cidr = cidr, what = "kiln sweep" },
      { to = "predictor", port = 7077, cidr = cidr, what = "kiln serve, inference over gRPC" },
      { to = "predictor", port = 7078, cidr = cidr, what = "inference over HTTP" },
    ]]),
    flatten([for cidr in var.metrics_cidrs : [
      { to = "api", port = 9470, cidr = cidr, what = "metrics" },
      { to = "log_ingest", port = 9471, cidr = cidr, what = "metrics" },
      { to = "provisioner", port = 9472, cidr = cidr, what = "metrics" },
      { to = "scheduler", port = 9473, cidr = cidr, what = "metrics" },
      { to = "runner", port = 9474, cidr = cidr, what = "metrics" },
      { to = "item_batch", port = 9475, cidr = cidr, what = "metrics" },
      { to = "advisor", port = 9476, cidr = cidr, what = "metrics" },
      { to = "predictor", port = 9477, cidr = cidr, what = "metrics" },
      { to = "nats", port = 8222, cidr = cidr, what = "NATS monitoring" },
      # Health checks of the gRPC ports of the services nobody else calls.
      { to = "scheduler", port = 7073, cidr = cidr, what = "gRPC health" },
      { to = "provisioner", port = 7072, cidr = cidr, what = "gRPC health" },
      { to = "runner", port = 7074, cidr = cidr, what = "gRPC health" },
    ]]),
  )
}

resource "aws_security_group" "this" {
  #checkov:skip=CKV2_AWS_5: attached in other modules (instances, launch templates, RDS) through the ids output, which checkov does not follow
  for_each    = local.groups
  name_prefix = "${var.name}-${replace(each.key, "_", "-")}-"
  description = each.value
  vpc_id      = var.vpc_id
  tags        = { Name = "${var.name}-${replace(each.key, "_", "-")}" }

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "from_groups" {
  for_each                     = { for r in local.from_groups : "${r.to}-${r.port}-from-${r.from}" => r }
  security_group_id            = aws_security_group.this[each.value.to].id
  referenced_security_group_id = aws_security_group.this[each.value.from].id
  ip_protocol                  = "tcp"
  from_port                    = each.value.port
  to_port                      = each.value.port
  description                  = each.value.what
}

resource "aws_vpc_security_group_ingress_rule" "from_cidrs" {
  for_each          = { for r in local.from_cidrs : "${r.to}-${r.port}-from-${r.cidr}" => r }
  security_group_id = aws_security_group.this[each.value.to].id
  cidr_ipv4         = each.value.cidr
  ip_protocol       = "tcp"
  from_port         = each.value.port
  to_port           = each.value.port
  description       = each.value.what
}

# Egress: kiln's own ports inside the VPC, and HTTPS anywhere (S3 through its gateway endpoint,
# Secrets Manager, SSM, package repositories; runners also pull job images from registries; the
# provisioner calls the EC2 API).
# The Amazon DNS resolver and time service are not subject to security groups.
resource "aws_vpc_security_group_egress_rule" "vpc" {
  for_each          = local.groups
  security_group_id = aws_security_group.this[each.key].id
  cidr_ipv4         = var.vpc_cidr
  ip_protocol       = "tcp"
  from_port         = 4222
  to_port           = 9477
  description       = "kiln, NATS, Postgres and Scylla ports inside the VPC"
}

resource "aws_vpc_security_group_egress_rule" "https" {
  for_each          = local.groups
  security_group_id = aws_security_group.this[each.key].id
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  description       = "HTTPS: AWS APIs, package repositories, container registries"
}

output "ids" {
  description = "Security group id by kind: api, scheduler, log_ingest, item_batch, advisor, predictor, provisioner, runner, nats, scylla, postgres."
  value       = { for k, g in aws_security_group.this : k => g.id }
}
