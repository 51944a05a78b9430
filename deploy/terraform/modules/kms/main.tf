# One customer-managed key for everything kiln stores at rest: EBS volumes, the RDS storage and
# its master password secret, the S3 bucket, the flow logs' log group. Rotated yearly by AWS.
variable "name" {
  description = "Alias of the key (alias/NAME)."
  type        = string
}

variable "create_autoscaling_service_linked_role" {
  description = "Create AWSServiceRoleForAutoScaling (true in an account that never had an Auto Scaling group: the key policy names it, and a key policy may name only roles that exist)."
  type        = bool
}

resource "aws_iam_service_linked_role" "autoscaling" {
  count            = var.create_autoscaling_service_linked_role ? 1 : 0
  aws_service_name = "autoscaling.amazonaws.com"
}

data "aws_caller_identity" "current" {}
data "aws_region" "current" {}
data "aws_partition" "current" {}

locals {
  account = data.aws_caller_identity.current.account_id
  region  = data.aws_region.current.name
  arn     = data.aws_partition.current.partition
}

data "aws_iam_policy_document" "key" {
  # In a key policy, "*" as resource means this key, not every key.
  #checkov:skip=CKV_AWS_109: a key policy's resource "*" is the key itself; the account's own IAM policies decide who else may manage it
  #checkov:skip=CKV_AWS_111: a key policy's resource "*" is the key itself; writes are limited to the account root, the log service and Auto Scaling
  #checkov:skip=CKV_AWS_356: a key policy's resource "*" is the key itself, not every resource
  statement {
    sid       = "AccountAdministers"
    actions   = ["kms:*"]
    resources = ["*"]
    principals {
      type        = "AWS"
      identifiers = ["arn:${local.arn}:iam::${local.account}:root"]
    }
  }

  # CloudWatch Logs encrypts the flow logs' log group with it.
  statement {
    sid = "CloudWatchLogsEncrypt"
    actions = [
      "kms:Encrypt*",
      "kms:Decrypt*",
      "kms:ReEncrypt*",
      "kms:GenerateDataKey*",
      "kms:Describe*",
    ]
    resources = ["*"]
    principals {
      type        = "Service"
      identifiers = ["logs.${local.region}.amazonaws.com"]
    }
    condition {
      test     = "ArnLike"
      variable = "kms:EncryptionContext:aws:logs:arn"
      values   = ["arn:${local.arn}:logs:${local.region}:${local.account}:log-group:*"]
    }
  }

  # Auto Scaling launches the runners' encrypted volumes with its service-linked role.
  statement {
    sid = "AutoScalingUsesForVolumes"
    actions = [
      "kms:Encrypt",
      "kms:Decrypt",
      "kms:ReEncrypt*",
      "kms:GenerateDataKey*",
      "kms:DescribeKey",
    ]
    resources = ["*"]
    principals {
      type        = "AWS"
      identifiers = ["arn:${local.arn}:iam::${local.account}:role/aws-service-role/autoscaling.amazonaws.com/AWSServiceRoleForAutoScaling"]
    }
  }

  statement {
    sid       = "AutoScalingGrantsForVolumes"
    actions   = ["kms:CreateGrant"]
    resources = ["*"]
    principals {
      type        = "AWS"
      identifiers = ["arn:${local.arn}:iam::${local.account}:role/aws-service-role/autoscaling.amazonaws.com/AWSServiceRoleForAutoScaling"]
    }
    condition {
      test     = "Bool"
      variable = "kms:GrantIsForAWSResource"
      values   = ["true"]
    }
  }
}

resource "aws_kms_key" "this" {
  description             = "${var.name}: EBS, RDS, S3, Secrets Manager and CloudWatch Logs at rest"
  enable_key_rotation     = true
  deletion_window_in_days = 30
  policy                  = data.aws_iam_policy_document.key.json
  depends_on              = [aws_iam_service_linked_role.autoscaling]
}

resource "aws_kms_alias" "this" {
  name          = "alias/${var.name}"
  target_key_id = aws_kms_key.this.key_id
}

output "arn" {
  description = "The key's ARN."
  value       = aws_kms_key.this.arn
}
