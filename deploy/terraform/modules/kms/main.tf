# One customer-managed key for everything kiln stores at rest: EBS volumes, the RDS storage and
# its master password secret, the S3 bucket, the flow logs' log group. Rotated yearly by AWS.
variable "name" {
  description = "Alias of the key (alias/NAME)."
  type        = string
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
  #checkov:skip=CKV_AWS_111: a key policy's resource "*" is the key itself; writes are limited to the account root, the log service and EC2 (kms:ViaService) in this account
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

  # The runners' encrypted root volumes: kiln-provisioner launches them (CreateFleet), and EC2
  # makes spot instances' volumes through its spot service-linked role. Any principal of this
  # account may use the key through EC2 only, as AWS's own aws/ebs key allows; naming the
  # principals instead would need the spot service-linked role to exist before the key (a key
  # policy may name only existing roles). Among kiln's roles, only the provisioner may create
  # volumes at all.
  statement {
    sid = "EbsThroughEc2"
    actions = [
      "kms:Encrypt",
      "kms:Decrypt",
      "kms:ReEncrypt*",
      "kms:GenerateDataKey*",
      "kms:CreateGrant",
      "kms:DescribeKey",
    ]
    resources = ["*"]
    principals {
      type        = "AWS"
      identifiers = ["*"]
    }
    condition {
      test     = "StringEquals"
      variable = "kms:CallerAccount"
      values   = [local.account]
    }
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["ec2.${local.region}.amazonaws.com"]
    }
  }
}

resource "aws_kms_key" "this" {
  description             = "${var.name}: EBS, RDS, S3, Secrets Manager and CloudWatch Logs at rest"
  enable_key_rotation     = true
  deletion_window_in_days = 30
  policy                  = data.aws_iam_policy_document.key.json
}

resource "aws_kms_alias" "this" {
  name          = "alias/${var.name}"
  target_key_id = aws_kms_key.this.key_id
}

output "arn" {
  description = "The key's ARN."
  value       = aws_kms_key.this.arn
}
