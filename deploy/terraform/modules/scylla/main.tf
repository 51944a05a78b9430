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
  description = "The key the root volumes (and the role's password parameter) are encrypted with."
  type        = string
}

variable "region" {
  description = "AWS region (of the password parameter)."
  type        = string
}

variable "password_parameter" {
  description = "SSM SecureString holding the password of the role `kiln` that log-ingest logs in as (put there by put-scylla-password.sh)."
  type        = string
}

variable "password_parameter_arn" {
  description = "The ARN of that parameter, for the nodes' role."
  type        = string
}

# The nodes read the role's password at first boot (the one AWS API they use besides Session
# Manager).
data "aws_iam_policy_document" "nodes" {
  statement {
    sid       = "ReadKilnRolePassword"
    actions   = ["ssm:GetParameter"]
    resources = [var.password_parameter_arn]
  }
  statement {
    sid       = "DecryptKilnRolePassword"
    actions   = ["kms:Decrypt"]
    resources = [var.kms_key_arn]
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["ssm.${var.region}.amazonaws.com"]
    }
  }
}

module "role" {
  source      = "../instance-role"
  name        = "${var.name}-scylla"
  policy_json = data.aws_iam_policy_document.nodes.json
}

locals {
  # The first node of each AZ seeds the others.
  seeds = join(",", slice(var.private_ips, 0, min(length(var.subnet_ids), length(var.private_ips))))
  user_data = jsonencode({
    scylla_yaml = {
      cluster_name = "${var.name}-scylla"
      # Password authentication: log-ingest logs in as `kiln` (the post-configuration script
      # makes the role); CQL is reachable from log-ingest's security group only.
      authenticator = "PasswordAuthenticator"
      # Each AZ is a rack of the region's datacenter.
      endpoint_snitch = "Ec2Snitch"
      seed_provider = [{
        class_name = "org.apache.cassandra.locator.SimpleSeedProvider"
        parameters = [{ seeds = local.seeds }]
      }]
    }
    start_scylla_on_first_boot = true
    # Run once Scylla is up (scylla-machine-image): the role `kiln` with the password of SSM,
    # and the default superuser's well-known password replaced by a random one nobody keeps.
    post_configuration_script = base64encode(templatefile("${path.module}/roles.sh.tftpl", {
      region    = var.region
      parameter = var.password_parameter
    }))
    post_configuration_script_timeout = 1800
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
